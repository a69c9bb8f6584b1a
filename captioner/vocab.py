"""The caption vocabulary written by prepro: ids 1..V are words, 0 is pad, BOS and EOS."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

from plumbing.errors import DataError


class Vocab:
    def __init__(self, ix_to_word: dict[str, str]):
        self.words = [ix_to_word[str(i)] for i in range(1, len(ix_to_word) + 1)]
        self.index = {w: i + 1 for i, w in enumerate(self.words)}

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        try:
            data = json.loads(Path(path).read_text())
            return cls(data["ix_to_word"])
        except FileNotFoundError:
            raise DataError(f"{path}: vocabulary not found (run captioner.prepro)") from None
        except (json.JSONDecodeError, KeyError) as exc:
            raise DataError(f"{path}: not a prepro vocab.json: {exc}") from None

    def to_json(self) -> dict:
        return {"ix_to_word": {str(i + 1): w for i, w in enumerate(self.words)}}

    def __len__(self) -> int:
        """Number of words; the model's output size is len + 1 (EOS at 0)."""
        return len(self.words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.words == other.words

    def differences(self, other: Vocab, limit: int = 5) -> str:
        if len(self) != len(other):
            return f"{len(self)} words vs {len(other)} words"
        diffs = [f"id {i + 1}: {a!r} vs {b!r}" for i, (a, b) in enumerate(zip(self.words, other.words, strict=True))
                 if a != b]
        return "; ".join(diffs[:limit])

    def decode(self, ids: Iterable[int]) -> str:
        words = []
        for i in ids:
            i = int(i)
            if i == 0:
                break
            words.append(self.words[i - 1])
        return " ".join(words)

    def decode_batch(self, tokens: torch.Tensor) -> list[str]:
        return [self.decode(row) for row in tokens.tolist()]
