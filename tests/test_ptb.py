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
# Beyond ASCII and beyond the Java lexer's plain rules: what model and user captions hold.
UNUSUAL = [
    "a dog’s ‘big’ ball, “stop” — don’t… the dogs’ bowls", "a café with crème brûlée 🍰 on the table",
    "wow!!! what?! really?!? ok!!!!!!", "a 3×4 grid at 50° and 3°C ©2020 ™ ® a−b −5 a+b a=b a*b a^b a~b a|b a\\b",
    "€5 £5 ¥5 ¢5 5¢ ½ cup 1½ cups ¾", "a\u200bzero a\ufeffbom x\u00adsoft a\x01b a\x7fb a🐶b 👍 𠀀 ext",
    "a « b » c ‹ d › „low quote“ ′prime″ ¿qué? ¡hola! a•b a§b a² x✓y a→b ≥ 5", "1990–2000 a dog—running ―",
    "Ελληνικά words, русский текст, 日本の猫 sits on 椅子, naïve e\u0301te", "a\u00a0nbsp\u3000ideographic\u2009thin",
    "a\u2028line\rbreaks\x0bstay\x0cone caption",
    "a smile :) a wink ;-) :D :P =( >:( :'] at 10:30) (see: here) :o :/ :Dog x;)y :))",
    "an AT&T sign, a Q&A, a B&W photo of #tag fun at&t a&b &amp; &lt;3 &quot;hi&quot; the '90s rock 'n' roll",
    "<b>bold</b> <a href='x'>link</a> see http://x.com/a?b=c. (https://y.org) a<b x>=y -> 1<2",
]


@needs_coco_1k
@pytest.mark.skipif(not java_available(), reason="needs java and pycocoevalcap's CoreNLP jar")
def test_python_tokenizer_matches_java_on_real_coco_captions():
    data = json.loads(SHARED_DATA.read_text())
    texts = [t for item in data for t in [item["candidate"], *item["refs"]]] + TRICKY + UNUSUAL
    java = java_ptb_tokenize(texts)
    ours = [ptb_tokenize(t) for t in texts]
    mismatches = [(t, j, o) for t, j, o in zip(texts, java, ours, strict=True) if j != o]
    share = 1 - len(mismatches) / len(texts)
    print(f"identical token lists: {share:.4%} of {len(texts)} captions")
    assert not mismatches, mismatches[:5]


def test_tokenizer_basics():
    assert ptb_tokenize("A Dog's BALL, on the grass.") == "a dog 's ball on the grass"
    assert ptb_tokenize("can't") == "ca n't"
    assert ptb_tokenize("!!") == "!!" and ptb_tokenize("no!") == "no"  # a run of marks is one kept token
    assert ptb_tokenize("don’t “stop” — 🐶 now…") == "do n't stop now"
    assert ptb_tokenize("a\u2028b") == "a b"  # a line separator is a space here too


@pytest.mark.skipif(not java_available(), reason="needs java and pycocoevalcap's CoreNLP jar")
def test_line_breaks_inside_a_caption_keep_every_caption_on_its_own_line():
    """Java's -preserveLines also ends a line at \\r, \\v, \\f, U+2028 and U+2029: pycocoevalcap, which
    replaces only \\n, then scores later captions against other captions' tokens."""
    texts = ["a\rb", "c", "d\u2028e", "f", "g\x0bh\x0ci\u2029j", "k"]
    assert java_ptb_tokenize(texts) == ["a b", "c", "d e", "f", "g h i j", "k"]
