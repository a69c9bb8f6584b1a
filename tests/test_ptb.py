from __future__ import annotations

import json

import pytest

from plumbing.ptb import ptb_tokenize
from plumbing.ptb_java import java_available, java_ptb_tokenize
from tests.conftest import SHARED_DATA, needs_coco_1k

TRICKY = [
    "A man's dog can't run (quickly) to the \"park\".",
    "The dogs' bowls are 3.5 inches, 1,000 of them... really -- yes!",
    "Mr. Smith and St. Louis at 5 p.m. in the U.S. street.",
    "A twin-hulled boat; cannot do it: gonna wanna 50% $5 #1 and/or a&b",
    "'Hello' said `the' cat's {curly} [square] A. B dog.",
    "A clock that reads 5:55, a word-- -word - x .5 etc. Jr.",
    "",
    "...",
]


@needs_coco_1k
@pytest.mark.skipif(not java_available(), reason="needs java and pycocoevalcap's CoreNLP jar")
def test_python_tokenizer_matches_java_on_real_coco_captions():
    data = json.loads(SHARED_DATA.read_text())
    texts = [t for item in data for t in [item["candidate"], *item["refs"]]] + TRICKY
    java = java_ptb_tokenize(texts)
    ours = [ptb_tokenize(t) for t in texts]
    mismatches = [(t, j, o) for t, j, o in zip(texts, java, ours, strict=True) if j != o]
    share = 1 - len(mismatches) / len(texts)
    print(f"identical token lists: {share:.4%} of {len(texts)} captions")
    assert not mismatches, mismatches[:5]


def test_tokenizer_basics():
    assert ptb_tokenize("A Dog's BALL, on the grass.") == "a dog 's ball on the grass"
    assert ptb_tokenize("can't") == "ca n't"
    assert ptb_tokenize("!!") == ""
