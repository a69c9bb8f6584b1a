"""Text diagnostics of captions: length, vocabulary, diversity, repetition and bad endings."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from plumbing.words import FUNCTION_WORDS


def _ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def text_diagnostics(tokenized: Sequence[str]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Corpus values and per-caption values of the text-only diagnostics."""
    captions = [c.split() for c in tokenized]
    lengths = [len(c) for c in captions]
    repeat = [(len(b) - len(set(b))) / len(b) if (b := _ngrams(c, 2)) else 0.0 for c in captions]
    bad_end = [float(bool(c) and c[-1] in FUNCTION_WORDS) for c in captions]
    corpus = {
        "mean_length": float(np.mean(lengths)) if lengths else 0.0,
        "vocab_used": float(len({w for c in captions for w in c})),
        "distinct_1": _distinct(captions, 1),
        "distinct_2": _distinct(captions, 2),
        "repeat_2": float(np.mean(repeat)) if repeat else 0.0,
        "bad_ending": float(np.mean(bad_end)) if bad_end else 0.0,
    }
    per_item = {"mean_length": [float(n) for n in lengths], "repeat_2": repeat, "bad_ending": bad_end}
    return corpus, per_item


def _distinct(captions: list[list[str]], n: int) -> float:
    grams = [g for c in captions for g in _ngrams(c, n)]
    return len(set(grams)) / len(grams) if grams else 0.0
