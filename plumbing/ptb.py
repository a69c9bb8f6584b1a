"""Caption normalisation equal to pycocoevalcap's PTBTokenizer, in pure Python.

pycocoevalcap runs Stanford's PTBTokenizer 3.4.1 (`-preserveLines -lowerCase`) and then drops
the tokens in PUNCTUATIONS. This module reproduces that output for caption text without
starting Java; `plumbing.ptb_java` keeps the Java path available. Agreement with the Java
tokenizer is measured on real COCO captions by the tests and the ngram benchmark.

Quirks kept on purpose because the reference has them: brackets become `-lrb-`/`-rrb-` after
lower-casing and so survive the (upper-case) punctuation filter; an abbreviation that ends a
line gets an extra "." token.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Exactly the tokens pycocoevalcap removes after tokenising.
PUNCTUATIONS = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)
_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_ABBREVIATIONS = frozenset(
    ["mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "inc", "ltd", "co", "corp", "mt", "ft", "jan", "feb",
     "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "ave", "blvd", "rd", "gen", "gov", "sgt",
     "capt", "lt", "col", "prof", "rev", "messrs"]
)
_CONTRACTIONS = ("n't", "'s", "'re", "'ve", "'ll", "'d", "'m")
_SPECIAL = {"cannot": 3, "gonna": 3, "gotta": 3, "wanna": 3}  # split after this many letters

# Pieces that always become tokens of their own, wherever they occur.
_SPLIT = re.compile(r"""(\.\.\.|--|(?<!\d)[,:]|[,:](?!\d)|[;!?(){}\[\]"&#$%]|``|'')""")


def ptb_tokens(text: str) -> list[str]:
    """PTBTokenizer tokens of one caption, lowercased, before the punctuation filter."""
    text = re.sub(r"\s+", " ", text)
    tokens: list[str] = []
    for chunk in _SPLIT.sub(r" \1 ", text).split():
        tokens.extend(_split_chunk(chunk))
    if tokens and _is_abbreviation(tokens[-1]):
        tokens.append(".")  # a line-final abbreviation also ends the sentence
    return [_token_text(t) for t in tokens]


def ptb_tokenize(text: str) -> str:
    """One caption -> pycocoevalcap's tokenised string (lowercase, punctuation tokens removed)."""
    return " ".join(t for t in ptb_tokens(text) if t not in PUNCTUATIONS)


def ptb_tokenize_all(texts: Iterable[str]) -> list[str]:
    return [ptb_tokenize(t) for t in texts]


def _token_text(token: str) -> str:
    if token == '"':
        return "''"
    return _BRACKETS.get(token, token).lower()


def _split_chunk(chunk: str) -> list[str]:
    if _SPLIT.fullmatch(chunk) or chunk.lower() in _CONTRACTIONS:
        return [chunk]
    lead: list[str] = []
    while len(chunk) > 1 and chunk[0] in "'`-":
        lead.append("`" if chunk[0] != "-" else "-")
        chunk = chunk[1:]
    trail: list[str] = []
    while len(chunk) > 1:
        if chunk.endswith(".") and not _keeps_period(chunk):
            trail.insert(0, ".")
            chunk = chunk[:-1]
        elif chunk[-1] in "'-":
            trail.insert(0, chunk[-1])
            chunk = chunk[:-1]
        else:
            break
    return lead + _split_contraction(chunk) + trail


def _keeps_period(chunk: str) -> bool:
    stem = chunk[:-1]
    return _is_abbreviation(chunk) or bool(re.fullmatch(r"[A-Za-z]", stem)) or chunk == "."


def _is_abbreviation(token: str) -> bool:
    if not token.endswith(".") or len(token) < 2:
        return False
    stem = token[:-1].lower()
    return stem in _ABBREVIATIONS or bool(re.fullmatch(r"([a-z]\.)+[a-z]", stem))


def _split_contraction(word: str) -> list[str]:
    lower = word.lower()
    if lower in _SPECIAL:
        cut = _SPECIAL[lower]
        return [word[:cut], word[cut:]]
    for tail in _CONTRACTIONS:
        if lower.endswith(tail) and len(word) > len(tail):
            return [word[: -len(tail)], word[-len(tail):]]
    return [word]
