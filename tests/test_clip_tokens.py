"""The memoised CLIP tokenizer gives open_clip's ids, first time and remembered, and its bounded
memos start over without changing an id."""

from __future__ import annotations

import json
import random
import string

import pytest
from open_clip.tokenizer import SimpleTokenizer

from features.clip_models import tokens
from features.clip_models.tokens import ClipTokenizer
from tests.conftest import load_coco_1k, needs_coco_1k

ODD_TEXTS = ["Café &amp; naïve 😀 it's 3.5 don't   WEIRD\tspaces", "", "   ", "ﬁ ligature Ⅻ", "<start_of_text> x",
             "A RED circle, above... the blue STAR!!", "x" * 300]


def _assert_open_clip_ids(texts: list[str], tokenizer: ClipTokenizer) -> None:
    reference = SimpleTokenizer(context_length=tokenizer.context_length)
    expected = [reference.encode(text) for text in texts]
    assert [list(tokenizer.encode(text)) for text in texts] == expected  # computed
    assert [list(tokenizer.encode(text)) for text in texts] == expected  # remembered


def test_world_captions_and_odd_text_tokenise_as_open_clip(tiny_world):
    images = json.loads((tiny_world / "dataset.json").read_text())["images"]
    texts = [s["raw"] for image in images for s in image["sentences"] + image["long_captions"]]
    _assert_open_clip_ids(texts + ODD_TEXTS, ClipTokenizer(248))


@needs_coco_1k
def test_real_coco_captions_tokenise_as_open_clip():
    items = load_coco_1k()[:200]
    _assert_open_clip_ids([item["candidate"] for item in items] + [r for item in items for r in item["refs"]],
                          ClipTokenizer(77))


def test_plain_ascii_without_ftfy_gives_open_clip_ids():
    """Printable ASCII without '&' skips ftfy; with '&', entities, tabs or escapes it does not."""
    rng = random.Random(0)
    pieces = [*string.printable, "&amp;", "&lt;b&gt;", "&#39;", "\x1b[31m", "\u2019", "caf\u00e9", "  "]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(3000)]
    texts += ["A small RED circle is above the star.", "a <b>bold</b> x;y #39; lt;", "x & y", "tab\there"]
    _assert_open_clip_ids(texts, ClipTokenizer(77))


def test_full_memos_start_over_with_the_same_ids(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(tokens, "MEMO_LIMIT", 3)
    tokenizer = ClipTokenizer(77)
    texts = ["a red circle", "a blue star above a red circle", "two shapes", "a red circle", *ODD_TEXTS]
    _assert_open_clip_ids(texts, tokenizer)
    assert len(tokenizer._text_ids) <= 3 and len(tokenizer._word_ids) <= 3


def test_ids_keep_eot_last_when_truncated():
    tokenizer = ClipTokenizer(8)
    [ids] = tokenizer.ids(["one two three four five six seven eight nine"])
    assert len(ids) == 8 and ids[0] == tokenizer.sot and ids[-1] == tokenizer.eot and tokenizer.truncated == 1
