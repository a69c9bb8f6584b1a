"""CIDEr document frequencies of a training corpus: built by prepro, read by the cider_d reward.

One document per image: an n-gram counts once for an image when any of its references holds it
(as in pycocoevalcap's CiderScorer). The file also stores the n-grams that end with the EOS
token, so the reward can count EOS as a word or not (an explicit, logged setting) from the same file.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from plumbing.atomic import atomic_path
from plumbing.errors import DataError

MAX_N = 4
EOS_TOKEN = "<eos>"
FORMAT = "rlcap-cider-df-v1"


def ngrams(tokens: Sequence[str], max_n: int = MAX_N) -> Counter[tuple[str, ...]]:
    counts: Counter[tuple[str, ...]] = Counter()
    for n in range(1, max_n + 1):
        for i in range(len(tokens) - n + 1):
            counts[tuple(tokens[i:i + n])] += 1
    return counts


def document_frequency(documents: Iterable[Sequence[Sequence[str]]], with_eos: bool = True) -> tuple[Counter, int]:
    """documents: per image, its tokenised references. Returns (df, number of documents)."""
    df: Counter[tuple[str, ...]] = Counter()
    n_docs = 0
    for refs in documents:
        n_docs += 1
        seen: set[tuple[str, ...]] = set()
        for tokens in refs:
            seen.update(ngrams(list(tokens) + ([EOS_TOKEN] if with_eos else [])))
        df.update(seen)
    return df, n_docs


def save_df(path: str | Path, df: Counter, n_docs: int, tokenizer: str) -> None:
    payload = {
        "format": FORMAT, "n_docs": n_docs, "max_n": MAX_N, "eos_token": EOS_TOKEN,
        "includes_eos_ngrams": True, "tokenizer": tokenizer,
        "df": {" ".join(gram): count for gram, count in df.items()},
    }
    with atomic_path(path) as tmp, gzip.open(tmp, "wt", encoding="utf-8") as fh:
        json.dump(payload, fh)


def load_df(path: str | Path, use_eos: bool) -> tuple[dict[tuple[str, ...], int], int]:
    """Read a df file; without `use_eos`, the n-grams holding EOS are dropped."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            payload = json.load(fh)
    except FileNotFoundError:
        raise DataError(f"{path}: CIDEr document-frequency file not found (run captioner.prepro)") from None
    except (OSError, json.JSONDecodeError, EOFError) as exc:
        raise DataError(f"{path}: unreadable CIDEr document-frequency file: {exc}") from None
    if payload.get("format") != FORMAT:
        raise DataError(f"{path}: not an rlcap CIDEr df file (format {payload.get('format')!r})")
    eos = payload["eos_token"]
    df = {
        tuple(gram.split(" ")): count for gram, count in payload["df"].items()
        if use_eos or eos not in gram.split(" ")
    }
    return df, int(payload["n_docs"])
