"""CLIP BPE tokenisation without padding: each text becomes [SOT, ..., EOT], truncated to the
model's context with EOT kept last (the rule of open_clip, OpenAI CLIP with truncate=True and
LongCLIP), and every truncation is counted so long captions are reported, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from open_clip.tokenizer import SimpleTokenizer

log = logging.getLogger(__name__)


class ClipTokenizer:
    def __init__(self, context_length: int):
        if context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {context_length}")
        self.bpe = SimpleTokenizer(context_length=context_length)
        self.context_length = context_length
        self.sot, self.eot = self.bpe.sot_token_id, self.bpe.eot_token_id
        self.truncated = 0  # texts cut to fit the context, over this tokenizer's life

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        out = []
        cut = 0
        for text in texts:
            tokens = [self.sot, *self.bpe.encode(text), self.eot]
            if len(tokens) > self.context_length:
                tokens = [*tokens[: self.context_length - 1], self.eot]
                cut += 1
            out.append(tokens)
        if cut:
            self.truncated += cut
            log.info("%d caption(s) longer than %d tokens truncated (EOT kept)", cut, self.context_length)
        return out

    def padded(self, token_ids: Sequence[Sequence[int]], length: int | None = None) -> torch.Tensor:
        """[n, length] zero-padded; `length` defaults to the longest sequence (trimmed batch)."""
        length = length or max(len(t) for t in token_ids)
        batch = torch.zeros(len(token_ids), length, dtype=torch.long)
        for row, tokens in enumerate(token_ids):
            batch[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        return batch

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        """Full-context tokens, exactly as open_clip's tokenizer returns them."""
        return self.padded(self.ids(texts), self.context_length)
