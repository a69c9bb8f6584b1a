"""Captions made ungrammatical on purpose, for the grammar head (CLIP-Caption-Reward's text
perturbations): a word repeated, a word removed, a word inserted, two neighbours swapped, the words
shuffled. A removal takes a function word or a noun, not an adjective, so that what is left is broken
rather than a shorter good caption."""

from __future__ import annotations

import random
from collections.abc import Sequence

CORRUPTIONS = ("repeat", "remove", "insert", "swap", "shuffle")
KEEP_WHEN_REMOVING = frozenset("red blue green yellow white black small large big little".split())


def corrupt(caption: str, rng: random.Random, vocabulary: Sequence[str], kinds: Sequence[str] = CORRUPTIONS
            ) -> tuple[str, str] | None:
    """(kind, corrupted caption), differing from the caption; None when no kind applies (one word)."""
    words = caption.split()
    for kind in rng.sample(list(kinds), len(kinds)):
        out = _apply(kind, words, rng, vocabulary)
        if out is not None and out != words:
            return kind, " ".join(out)
    return None


def _apply(kind: str, words: list[str], rng: random.Random, vocabulary: Sequence[str]) -> list[str] | None:
    if len(words) < 2:
        return None
    out = list(words)
    if kind == "repeat":  # a word or a two-word phrase said twice in a row
        i = rng.randrange(len(words))
        span = words[i:i + rng.choice((1, 2))]
        return out[:i + len(span)] + span + out[i + len(span):]
    if kind == "remove":
        removable = [i for i, w in enumerate(words) if w.lower() not in KEEP_WHEN_REMOVING]
        if not removable:
            return None
        del out[rng.choice(removable)]
        return out
    if kind == "insert":
        out.insert(rng.randrange(len(words) + 1), rng.choice(vocabulary))
        return out
    if kind == "swap":
        i = rng.randrange(len(words) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
        return out
    if kind == "shuffle":
        while out == words and len(set(words)) > 1:
            rng.shuffle(out)
        return out
    raise ValueError(f"unknown corruption {kind!r}")
