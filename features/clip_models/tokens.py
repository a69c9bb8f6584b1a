"""CLIP BPE tokenisation without padding: each text becomes [SOT, ..., EOT], truncated to the
model's context with EOT kept last (the rule of open_clip, OpenAI CLIP with truncate=True and
LongCLIP), and every truncation is counted so long captions are reported, never fatal.

The ids are open_clip's `SimpleTokenizer.encode` ids, memoised: a training run tokenises the same
captions every epoch and hard negatives that differ from them in one word, and open_clip's text
cleaning and byte mapping cost more than the model's step saves on a small CPU model. Texts never seen
before (a text stage's statements are mostly new) skip ftfy when it could not change them."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from open_clip.tokenizer import SimpleTokenizer, get_clean_fn

log = logging.getLogger(__name__)

MEMO_LIMIT = 1 << 18  # texts (and, separately, words) remembered; a full memo starts over


class ClipTokenizer:
    def __init__(self, context_length: int):
        if context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {context_length}")
        self.bpe = SimpleTokenizer(context_length=context_length)
        self._lower_clean = self.bpe.clean_fn is get_clean_fn("lower")
        self.context_length = context_length
        self.sot, self.eot = self.bpe.sot_token_id, self.bpe.eot_token_id
        self.truncated = 0  # texts cut to fit the context, over this tokenizer's life
        self._text_ids: dict[str, tuple[int, ...]] = {}
        self._word_ids: dict[str, tuple[int, ...]] = {}

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        out = []
        cut = 0
        for text in texts:
            tokens = [self.sot, *self.encode(text), self.eot]
            if len(tokens) > self.context_length:
                tokens = [*tokens[: self.context_length - 1], self.eot]
                cut += 1
            out.append(tokens)
        if cut:
            self.truncated += cut
            log.info("%d caption(s) longer than %d tokens truncated (EOT kept)", cut, self.context_length)
        return out

    def encode(self, text: str) -> tuple[int, ...]:
        """The BPE ids of text, without SOT/EOT: `SimpleTokenizer.encode(text)`, from the memo when
        this text or its words were seen before."""
        ids = self._text_ids.get(text)
        if ids is None:
            ids = tuple(i for word in self.bpe.pat.findall(self._clean(text)) for i in self._word(word))
            _remember(self._text_ids, text, ids)
        return ids

    def _clean(self, text: str) -> str:
        """open_clip's default cleaning (ftfy, HTML unescaping twice, whitespace, lower case). ftfy and
        the unescaping leave printable ASCII without '&' as it is, and cost most of a new text's encode."""
        if self._lower_clean and text.isascii() and text.isprintable() and "&" not in text:
            return " ".join(text.split()).lower()
        return self.bpe.clean_fn(text)

    def forget(self) -> None:
        """Empty the memos (what a fresh tokenizer would have)."""
        self._text_ids.clear()
        self._word_ids.clear()

    def _word(self, word: str) -> tuple[int, ...]:
        ids = self._word_ids.get(word)
        if ids is None:  # open_clip's per-word step of SimpleTokenizer.encode
            mapped = "".join(self.bpe.byte_encoder[b] for b in word.encode("utf-8"))
            ids = tuple(self.bpe.encoder[piece] for piece in self.bpe.bpe(mapped).split(" "))
            _remember(self._word_ids, word, ids)
        return ids

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


def _remember(memo: dict, key: str, ids: tuple[int, ...]) -> None:
    if len(memo) >= MEMO_LIMIT:  # bounded without LRU bookkeeping on every hit
        memo.clear()
    memo[key] = ids
