"""Cheaper text-tower batches, exact: texts grouped by length, and shared prefixes computed once.

Both rest on the causal mask: a position's hidden states depend only on the tokens up to it.
- Trailing padding changes nothing, so texts are run in groups of similar length, each trimmed to
  its longest (`length_groups`).
- A hard negative is its caption with one fact changed, so it repeats the caption up to that fact
  (about half of a negative's tokens on the offline world), and SPECS's triplet texts are the
  caption's own prefixes: their prefix states *are* the caption's. `shared_prefix_text_forward`
  packs each caption with the suffixes of the texts made from it into one row, under a tree-shaped
  mask (a suffix sees the caption's tokens before the point where they part, then its own tokens
  causally): a third fewer tokens through the tower, same outputs and gradients up to rounding.
- The embedding reads one position per text (its EOT), so the last block computes keys and values
  everywhere but queries, projection and MLP only there (`pooled_block`): on the world CLIP's two
  blocks the text step falls by about a quarter (`python -m rewards.bench text`).

The shared-prefix forward knows open_clip's text transformer (`ResidualAttentionBlock` with
`nn.MultiheadAttention`, EOT pooling); for any other tower it returns None and callers keep the
plain forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from plumbing.attention import attend

MIN_SHARED = 4  # a row sharing fewer leading tokens runs whole: gathering its prefix saves nothing


def length_groups(lengths: torch.Tensor, slack: float = 1.25, min_rows: int = 8) -> list[tuple[torch.Tensor, int]]:
    """(row indices, longest length) per group of rows of similar length, shortest first (the lengths
    come back to the host once, not once per group): a group closes once it has `min_rows` rows and
    the next text is over `slack` times its shortest, so a group's padding stays near `slack` times its
    real tokens (a batch of short references and long captions pads to 1.2x, not 1.8x as in four equal
    groups) while no group is too small to keep the matmuls efficient."""
    order = torch.argsort(lengths, stable=True)
    ordered = lengths[order].clamp(min=1).tolist()
    groups, start = [], 0
    for end in range(1, len(ordered) + 1):
        if end == len(ordered) or (end - start >= min_rows and ordered[end] > slack * ordered[start]):
            groups.append((order[start:end], ordered[end - 1]))
            start = end
    return groups


@dataclass
class PrefixTree:
    """Which row each text shares its leading tokens with: `parent[i]` is -1 for a root (run whole),
    else a root's row; row i's first `shared[i]` tokens equal its parent's (0 for a root)."""

    parent: torch.Tensor  # [N] long
    shared: torch.Tensor  # [N] long

    @staticmethod
    def roots(count: int, device: torch.device | str = "cpu") -> PrefixTree:
        return PrefixTree(torch.full((count,), -1, dtype=torch.long, device=device),
                          torch.zeros(count, dtype=torch.long, device=device))

    def cat(self, other: PrefixTree) -> PrefixTree:
        """This tree's rows, then `other`'s (its parents shifted to their new rows)."""
        parent = torch.where(other.parent < 0, other.parent, other.parent + len(self.parent))
        return PrefixTree(torch.cat([self.parent, parent]), torch.cat([self.shared, other.shared]))


def prefix_tree(tokens: torch.Tensor, block: int) -> PrefixTree:
    """The tree of [N, L] token rows that come in blocks of `block` (an image's caption, then texts
    made from it): a row's parent is its block's first row, for as many leading tokens as the two
    share. A row's EOT is always its own (it is the pooled position), so `shared` stops before it."""
    rows = torch.arange(len(tokens), device=tokens.device)
    first = rows - rows % block
    same = (tokens == tokens[first]).long().cumprod(dim=1).sum(dim=1)
    shared = torch.minimum(same, tokens.argmax(dim=1))
    is_root = (first == rows) | (shared < MIN_SHARED)
    return PrefixTree(torch.where(is_root, -1, first), torch.where(is_root, 0, shared))


def shared_prefix_text_forward(model: Any) -> Callable[[torch.Tensor, PrefixTree], torch.Tensor] | None:
    """forward(tokens [N, L], tree) -> [N, d]: open_clip's encode_text with each shared prefix run
    once; None when the text tower is not one this forward knows."""
    if not supports_pooled_block(model):
        return None

    def forward(tokens: torch.Tensor, tree: PrefixTree) -> torch.Tensor:
        return _SharedForward(model, tokens, tree).run()

    return forward


def project_text(model: Any, pooled: torch.Tensor) -> torch.Tensor:
    """The text tower's projection, a Linear or a matrix (open_clip has both)."""
    projection = model.text_projection
    return projection(pooled) if isinstance(projection, torch.nn.Linear) else pooled @ projection


def supports_pooled_block(model: Any) -> bool:
    """Whether the model's text tower is open_clip's, with blocks that `_qkv`, `_finish_block` and
    `pooled_block` know, pooled at the EOT under a causal mask."""
    blocks = getattr(getattr(model, "transformer", None), "resblocks", None)
    if not blocks or getattr(model, "text_pool_type", "argmax") != "argmax" \
            or getattr(model, "attn_mask", None) is None or not hasattr(model, "token_embedding"):
        return False
    return all(isinstance(getattr(block, "attn", None), torch.nn.MultiheadAttention)
               and block.attn._qkv_same_embed_dim and block.attn.dropout == 0.0
               and not hasattr(block, "ln_1_kv") and hasattr(block, "mlp") for block in blocks)


class _SharedForward:
    """One call: each root packed with its children's suffixes into one row (tree attention: a
    suffix sees its root's tokens before its shared length, then its own tokens causally), the
    packed rows run in groups of similar length."""

    def __init__(self, model: Any, tokens: torch.Tensor, tree: PrefixTree):
        self.model, self.device = model, tokens.device
        self.cast = model.transformer.get_cast_dtype()
        self.packed = _Packing.of(tokens.cpu(), tree.parent.cpu(), tree.shared.cpu())

    def run(self) -> torch.Tensor:
        packed = self.packed
        outputs, order = [], []
        groups = [rows for rows, _ in length_groups(packed.lengths)]
        for rows, x in zip(groups, self._embed(groups), strict=True):
            # the [n, T, T] mask is built where it is used: on a GPU the host only sends [n, T] rows
            segments, positions, starts = (packed.padded(stream, rows, x.shape[1]).to(self.device)
                                           for stream in (packed.segments, packed.positions, packed.starts))
            mask = _tree_mask(segments, positions, starts)
            *early, last = self.model.transformer.resblocks
            for block in early:
                q, k, v = _qkv(block, x)
                x = _finish_block(block, x, attend(q, k, v, attn_mask=mask))
            texts, *at = packed.pooled_of(rows)
            local, slots, queries = (t.to(self.device) for t in at)
            seen = mask.gather(2, queries[:, None, :, None].expand(-1, 1, -1, mask.shape[-1]))
            outputs.append(pooled_block(last, x, queries, seen)[local, slots])
            order.append(texts)
        pooled = project_text(self.model, self.model.ln_final(torch.cat(outputs)))
        out = torch.empty_like(pooled)
        out[torch.cat(order).to(self.device)] = pooled
        return out

    def _embed(self, groups: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every group's token and position embeddings [n, T, width], from one lookup each (a lookup's
        backward writes a gradient as large as the vocabulary's table). Positions go through
        `embedding` too: indexing's backward accumulates in a thread-dependent order, and a resumed
        run must reproduce its weights bit for bit."""
        packed, context = self.packed, self.model.positional_embedding.shape[0]
        shapes = [(len(rows), int(packed.lengths[rows].max())) for rows in groups]
        ids, positions = (torch.cat([packed.padded(stream, rows, t).flatten()
                                     for rows, (_, t) in zip(groups, shapes, strict=True)])
                          for stream in (packed.ids, packed.positions))
        positions = positions.clamp(0, context - 1).to(self.device)
        x = self.model.token_embedding(ids.clamp(min=0).to(self.device)).to(self.cast) \
            + F.embedding(positions, self.model.positional_embedding).to(self.cast)
        return [chunk.view(n, t, -1) for chunk, (n, t) in zip(x.split([n * t for n, t in shapes]), shapes, strict=True)]


@dataclass
class _Packing:
    """Every packed row (a root, then its children's suffixes) laid end to end in token streams,
    built with whole-batch tensor ops (a Python loop over the texts took about 6 ms a batch, these 0.3 ms).
    Packed row j holds the streams' tokens [offset[j], offset[j] + lengths[j]); text i (a batch row)
    has its EOT at index end[i] of the packed row it is in."""

    ids: torch.Tensor        # [tokens] token ids
    positions: torch.Tensor  # [tokens] each token's position in its own text
    segments: torch.Tensor   # [tokens] 0 for a root's tokens, k for its k-th child's
    starts: torch.Tensor     # [tokens] the shared length of the token's text (0 for a root's)
    offset: torch.Tensor     # [packed rows]
    lengths: torch.Tensor    # [packed rows]
    end: torch.Tensor        # [texts]
    text_order: torch.Tensor  # [texts] batch rows, packed row by packed row, root first
    text_offset: torch.Tensor  # [packed rows + 1] where each packed row's texts start in text_order

    @classmethod
    def of(cls, tokens: torch.Tensor, parent: torch.Tensor, shared: torch.Tensor) -> _Packing:
        count = len(tokens)
        rows = torch.arange(count)
        is_root = parent < 0
        root = torch.where(is_root, rows, parent)
        text_order = torch.argsort(root * count + rows)  # by root (in row order), then row
        slot_of_root = torch.cumsum(is_root.long(), 0) - 1
        start = torch.where(is_root, 0, shared)[text_order]
        length = tokens.argmax(dim=1)[text_order] + 1 - start
        slot = slot_of_root[root[text_order]]
        token_text = torch.repeat_interleave(rows, length)  # [tokens] -> its text's place in text_order
        text_begin = torch.cumsum(length, 0) - length
        within = torch.arange(len(token_text)) - text_begin[token_text]
        positions = start[token_text] + within
        lengths = torch.zeros(int(is_root.sum()), dtype=torch.long).index_add_(0, slot, length)
        offset = torch.cumsum(lengths, 0) - lengths
        end = torch.empty(count, dtype=torch.long)
        end[text_order] = text_begin + length - 1 - offset[slot]
        text_offset = F.pad(torch.cumsum(torch.bincount(slot, minlength=len(lengths)), 0), (1, 0))
        first = text_offset[slot]  # each text's root's place in text_order
        return cls(ids=tokens[text_order[token_text], positions], positions=positions,
                   segments=(rows - first)[token_text], starts=start[token_text],
                   offset=offset, lengths=lengths, end=end, text_order=text_order, text_offset=text_offset)

    def padded(self, stream: torch.Tensor, rows: torch.Tensor, longest: int) -> torch.Tensor:
        """The packed rows `rows` of a stream as [n, longest], padded with -1 (for `_tree_mask`,
        padding is the tokens of segment -1)."""
        index = self.offset[rows, None] + torch.arange(longest)
        inside = torch.arange(longest) < self.lengths[rows, None]
        return torch.where(inside, stream[index.clamp(max=len(stream) - 1)], -1)

    def pooled_of(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """For the packed rows `rows`: the batch rows packed in them (in `rows`' order, each packed row's
        root first), the place in `rows` of the packed row each is in, each one's slot among its packed
        row's texts, and the pooled positions [len(rows), Q] (Q: the most texts in one packed row; a
        row's spare slots point at its position 0, a root token, and are dropped) for `pooled_block`."""
        counts = self.text_offset[rows + 1] - self.text_offset[rows]
        local = torch.repeat_interleave(torch.arange(len(rows)), counts)
        slots = torch.arange(len(local)) - (torch.cumsum(counts, 0) - counts)[local]
        texts = self.text_order[self.text_offset[rows][local] + slots]
        queries = torch.zeros(len(rows), int(slots.max()) + 1, dtype=torch.long)
        queries[local, slots] = self.end[texts]
        return texts, local, slots, queries


def _tree_mask(segments: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """[n, 1, T, T]: token a sees token b of its own text at or before it, and the root's tokens
    before a's shared length; padding (segment -1) sees only padding, so no softmax row is empty."""
    index = torch.arange(segments.shape[1], device=segments.device).expand_as(segments)
    padding = segments < 0
    positions = torch.where(padding, index, positions)
    starts = torch.where(padding, 0, starts)
    own = (segments[:, :, None] == segments[:, None, :]) & (positions[:, None, :] <= positions[:, :, None])
    from_root = (segments[:, None, :] == 0) & (positions[:, None, :] < starts[:, :, None])
    return (own | from_root)[:, None]


def _qkv(block: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block's queries, keys and values of x [n, L, width], each [n, heads, L, head width]."""
    attn = block.attn
    n, length, width = x.shape
    qkv = F.linear(block.ln_1(x), attn.in_proj_weight, attn.in_proj_bias)
    qkv = qkv.view(n, length, 3, attn.num_heads, width // attn.num_heads).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


def pooled_block(block: torch.nn.Module, x: torch.Tensor, queries: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """The last residual block's output [n, Q, width] at positions `queries` [n, Q] of x [n, L, width]
    alone: every position's keys and values, but queries, projection and MLP only where the tower
    pools (its EOT), which is all the text embedding reads. `seen` [n, 1, Q, L] is the attention
    mask's rows at those positions. The tower's other positions cost the last block two of its twelve
    width-squared products per token instead of twelve."""
    attn = block.attn
    n, length, width = x.shape
    heads = attn.num_heads
    normed = block.ln_1(x)
    kv = F.linear(normed, attn.in_proj_weight[width:], attn.in_proj_bias[width:])
    kv = kv.view(n, length, 2, heads, width // heads).permute(2, 0, 3, 1, 4)
    picked = queries[:, :, None].expand(-1, -1, width)
    q = F.linear(normed.gather(1, picked), attn.in_proj_weight[:width], attn.in_proj_bias[:width])
    q = q.view(n, queries.shape[1], heads, width // heads).transpose(1, 2)
    attended = attend(q, kv[0], kv[1], attn_mask=seen)
    return _finish_block(block, x.gather(1, picked), attended)


def _finish_block(block: torch.nn.Module, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The residual attention block's rest: heads merged and projected, then the MLP."""
    n, heads, length, head_width = attended.shape
    merged = attended.transpose(1, 2).reshape(n, length, heads * head_width)
    x = x + block.ls_1(block.attn.out_proj(merged))
    return x + block.ls_2(block.mlp(block.ln_2(x)))
