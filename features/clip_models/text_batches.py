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
    if not _supported(model):
        return None

    def forward(tokens: torch.Tensor, tree: PrefixTree) -> torch.Tensor:
        return _SharedForward(model, tokens, tree).run()

    return forward


def _supported(model: Any) -> bool:
    blocks = getattr(getattr(model, "transformer", None), "resblocks", None)
    if blocks is None or getattr(model, "text_pool_type", "argmax") != "argmax" \
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
        self.packed = _pack(tokens.cpu(), tree.parent.cpu(), tree.shared.cpu())

    def run(self) -> torch.Tensor:
        groups = [[self.packed[i] for i in rows.tolist()]
                  for rows, _ in length_groups(torch.tensor([len(p.ids) for p in self.packed]))]
        outputs, order = [], []
        for group, x in zip(groups, self._embed(groups), strict=True):
            # the [n, T, T] mask is built where it is used: on a GPU the host only sends [n, T] rows
            segments, positions, starts = (_padded([getattr(p, name) for p in group], x.shape[1]).to(self.device)
                                           for name in ("segments", "positions", "starts"))
            mask = _tree_mask(segments, positions, starts)
            for block in self.model.transformer.resblocks:
                q, k, v = _qkv(block, x)
                x = _finish_block(block, x, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            slots = torch.tensor([slot for slot, p in enumerate(group) for _ in p.rows])
            ends = torch.tensor([end for p in group for end in p.ends])
            outputs.append(x[slots.to(self.device), ends.to(self.device)])
            order += [row for p in group for row in p.rows]
        pooled = self.model.ln_final(torch.cat(outputs))
        projection = self.model.text_projection
        pooled = projection(pooled) if isinstance(projection, torch.nn.Linear) else pooled @ projection
        out = torch.empty_like(pooled)
        out[torch.tensor(order, device=self.device)] = pooled
        return out

    def _embed(self, groups: list[list[_Packed]]) -> list[torch.Tensor]:
        """Every group's token and position embeddings [n, T, width], from one lookup each (a lookup's
        backward writes a gradient as large as the vocabulary's table). Positions go through
        `embedding` too: indexing's backward accumulates in a thread-dependent order, and a resumed
        run must reproduce its weights bit for bit."""
        context = self.model.positional_embedding.shape[0]
        shapes = [(len(group), max(len(p.ids) for p in group)) for group in groups]
        ids, positions = (torch.cat([_padded([getattr(p, name) for p in group], t).flatten()
                                     for group, (_, t) in zip(groups, shapes, strict=True)])
                          for name in ("ids", "positions"))
        positions = positions.clamp(0, context - 1).to(self.device)
        x = self.model.token_embedding(ids.clamp(min=0).to(self.device)).to(self.cast) \
            + F.embedding(positions, self.model.positional_embedding).to(self.cast)
        return [chunk.view(n, t, -1) for chunk, (n, t) in zip(x.split([n * t for n, t in shapes]), shapes, strict=True)]


@dataclass
class _Packed:
    """A root and its children's suffixes in one row."""

    rows: list[int]          # the batch rows packed here, the root first
    ends: list[int]          # each one's EOT index in the packed row
    ids: torch.Tensor        # [T] token ids
    positions: torch.Tensor  # [T] each token's position in its own text
    segments: torch.Tensor   # [T] 0 for the root's tokens, k for the k-th child's
    starts: torch.Tensor     # [T] the shared length of the token's text (0 for the root's)


def _pack(tokens: torch.Tensor, parent: torch.Tensor, shared: torch.Tensor) -> list[_Packed]:
    eot = tokens.argmax(dim=1).tolist()
    members: dict[int, list[int]] = {}
    for row, up in enumerate(parent.tolist()):
        members.setdefault(row if up < 0 else up, []).append(row)
    shared_ = shared.tolist()
    packed = []
    for root, rows in members.items():
        spans = [(0 if row == root else shared_[row], eot[row] + 1) for row in rows]
        lengths = torch.tensor([end - start for start, end in spans])
        packed.append(_Packed(
            rows, (torch.cumsum(lengths, 0) - 1).tolist(),
            torch.cat([tokens[row, start:end] for row, (start, end) in zip(rows, spans, strict=True)]),
            torch.cat([torch.arange(start, end) for start, end in spans]),
            torch.repeat_interleave(torch.arange(len(rows)), lengths),
            torch.repeat_interleave(torch.tensor([start for start, _ in spans]), lengths)))
    return packed


def _padded(rows: list[torch.Tensor], longest: int) -> torch.Tensor:
    """[n, longest], padded with -1 (for `_tree_mask`, padding is the tokens of segment -1)."""
    out = torch.full((len(rows), longest), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


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


def _finish_block(block: torch.nn.Module, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The residual attention block's rest: heads merged and projected, then the MLP."""
    n, heads, length, head_width = attended.shape
    merged = attended.transpose(1, 2).reshape(n, length, heads * head_width)
    x = x + block.ls_1(block.attn.out_proj(merged))
    return x + block.ls_2(block.mlp(block.ln_2(x)))
