"""The Transformer captioner: a visual stem, a Transformer encoder over grid/region tokens, and a
decoder whose self-attention keys/values can be cached for fast step-by-step decoding.

Token ids: 1..V are words; 0 is BOS on the input side and EOS/pad on the output side, as in the
reference SCST codebase. The output layer has V + 1 classes (0 = EOS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from plumbing.attention import attend
from plumbing.config import option
from plumbing.errors import ConfigError


@dataclass
class ModelConfig:
    d_model: int = option(512, help="model width", at_least=1)
    n_heads: int = option(8, help="attention heads (must divide d_model)", at_least=1)
    enc_layers: int = option(6, help="encoder layers", at_least=1)
    dec_layers: int = option(6, help="decoder layers", at_least=1)
    d_ff: int = option(2048, help="feed-forward width", at_least=1)
    dropout: float = option(0.1, help="dropout probability", at_least=0, at_most=1)
    use_pooled: bool = option(False, help="add the pooled feature as one more memory token")
    tie_embeddings: bool = option(True, help="the output layer shares the word embedding")
    visual_stem: Literal["linear", "patch_conv"] = option("linear", help="patch_conv: a CNN over `patches` features")
    stem_channels: list[int] = option(factory=lambda: [32, 64, 128], help="patch_conv: channels of the stride-2 convs",
                                      at_least=1)


class LinearStem(nn.Module):
    def __init__(self, feat_dim: int, d_model: int, n_tokens: int):
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(feat_dim, d_model), nn.LayerNorm(d_model))
        self.n_tokens = n_tokens

    def forward(self, att: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.proj(att), mask


class PatchConvStem(nn.Module):
    """Reassembles `patches` features into the image and runs a small CNN, so shapes can be learned
    end to end from pixels that were stored once in feats.h5. A full-resolution conv keeps the fine
    detail that tells shapes apart, stride-2 stages follow, and a last stride-1 conv widens the
    receptive field to a whole object."""

    def __init__(self, feat_dim: int, n_patches: int, d_model: int, channels: list[int]):
        super().__init__()
        grid = round(n_patches ** 0.5)
        patch = round((feat_dim / 3) ** 0.5)
        if grid * grid != n_patches or 3 * patch * patch != feat_dim:
            raise ConfigError(f"visual_stem 'patch_conv' needs `patches` features ([G*G, 3*p*p]); "
                              f"got [{n_patches}, {feat_dim}]")
        self.grid, self.patch = grid, patch
        layers: list[nn.Module] = [nn.Conv2d(3, channels[0], 3, padding=1), nn.GroupNorm(8, channels[0]), nn.GELU()]
        in_ch = channels[0]
        for out_ch in channels:
            layers += [nn.Conv2d(in_ch, out_ch, 3, stride=2, padding=1), nn.GroupNorm(8, out_ch), nn.GELU()]
            in_ch = out_ch
        layers += [nn.Conv2d(in_ch, in_ch, 3, padding=1), nn.GroupNorm(8, in_ch), nn.GELU()]
        self.cnn = nn.Sequential(*layers)
        self.proj = nn.Linear(in_ch, d_model)
        side = grid * patch
        for _ in channels:
            side = (side + 1) // 2
        self.n_tokens = side * side

    def forward(self, att: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        side = self.grid * self.patch
        image = F.fold(att.transpose(1, 2), (side, side), kernel_size=self.patch, stride=self.patch)
        maps = self.cnn((image - 0.5) / 0.25)
        tokens = self.proj(maps.flatten(2).transpose(1, 2))
        return tokens, torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln_self, self.ln_cross, self.ln_ff = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.self_out = nn.Linear(d, d)
        self.cross_q = nn.Linear(d, d)
        self.cross_kv = nn.Linear(d, 2 * d)
        self.cross_out = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d))
        self.drop = nn.Dropout(dropout)
        self.attn_drop = dropout

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        return x.view(n, t, self.heads, d // self.heads).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        n, h, t, dh = x.shape
        return x.transpose(1, 2).reshape(n, t, h * dh)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.cross_kv(memory).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def forward(self, x: torch.Tensor, mem: tuple[torch.Tensor, torch.Tensor], mem_mask: torch.Tensor,
                cache: list[torch.Tensor] | None = None, start: int = 0) -> torch.Tensor:
        p = self.attn_drop if self.training else 0.0
        q, k, v = (self._heads(t) for t in self.qkv(self.ln_self(x)).chunk(3, dim=-1))
        if cache is not None and cache[0].shape[2] == start:  # growing cache: autograd-safe
            cache[0], cache[1] = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            k, v = cache[0], cache[1]
        elif cache is not None:  # preallocated cache: write this step in place (inference)
            t = q.shape[2]
            cache[0][:, :, start:start + t] = k
            cache[1][:, :, start:start + t] = v
            k, v = cache[0][:, :, :start + t], cache[1][:, :, :start + t]
        causal = q.shape[2] > 1
        attn = attend(q, k, v, dropout_p=p, is_causal=causal and start == 0)
        x = x + self.drop(self.self_out(self._merge(attn)))
        q = self._heads(self.cross_q(self.ln_cross(x)))
        attn = attend(q, mem[0], mem[1], attn_mask=mem_mask[:, None, None, :], dropout_p=p)
        x = x + self.drop(self.cross_out(self._merge(attn)))
        return x + self.drop(self.ff(self.ln_ff(x)))


class Captioner(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, max_len: int, feat_dim: int, n_tokens: int, fc_dim: int):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ConfigError(f"model.d_model ({cfg.d_model}) must be divisible by model.n_heads ({cfg.n_heads})")
        for key in ("enc_layers", "dec_layers"):
            if getattr(cfg, key) < 1:
                raise ConfigError(f"model.{key} must be at least 1, got {getattr(cfg, key)}")
        self.cfg, self.vocab_size, self.max_len = cfg, vocab_size, max_len
        d = cfg.d_model
        if cfg.visual_stem == "patch_conv":
            self.stem: nn.Module = PatchConvStem(feat_dim, n_tokens, d, cfg.stem_channels)
        else:
            self.stem = LinearStem(feat_dim, d, n_tokens)
        self.grid_pos = nn.Parameter(torch.zeros(1, self.stem.n_tokens, d))
        self.fc_proj = nn.Linear(fc_dim, d) if cfg.use_pooled else None
        layer = nn.TransformerEncoderLayer(d, cfg.n_heads, cfg.d_ff, cfg.dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.enc_layers, enable_nested_tensor=False)
        self.enc_norm = nn.LayerNorm(d)
        self.embed = nn.Embedding(vocab_size + 1, d)
        self.pos = nn.Embedding(max_len + 1, d)
        self.layers = nn.ModuleList(DecoderLayer(d, cfg.n_heads, cfg.d_ff, cfg.dropout) for _ in range(cfg.dec_layers))
        self.dec_norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab_size + 1, bias=False)
        if cfg.tie_embeddings:
            self.out.weight = self.embed.weight
        self.drop = nn.Dropout(cfg.dropout)
        nn.init.normal_(self.grid_pos, std=0.02)
        nn.init.normal_(self.embed.weight, std=0.02)

    def encode(self, att: torch.Tensor, fc: torch.Tensor, att_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, mask = self.stem(att, att_mask)
        tokens = tokens + self.grid_pos
        if self.fc_proj is not None:
            tokens = torch.cat([self.fc_proj(fc)[:, None], tokens], dim=1)
            mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
        memory = self.encoder(self.drop(tokens), src_key_padding_mask=~mask)
        return self.enc_norm(memory), mask

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.memory_kv(memory) for layer in self.layers]

    def decode(self, tokens: torch.Tensor, mem_kv: list, mem_mask: torch.Tensor,
               cache: list[list[torch.Tensor]] | None = None, start: int = 0) -> torch.Tensor:
        """Logits [N, T, V+1] for input tokens at positions start..start+T-1."""
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.drop(self.embed(tokens) + self.pos(positions)[None])
        for k, layer in enumerate(self.layers):
            x = layer(x, mem_kv[k], mem_mask, None if cache is None else cache[k], start)
        return self.out(self.dec_norm(x))

    def new_cache(self, n: int, device: torch.device, dtype: torch.dtype) -> list[list[torch.Tensor]]:
        """Preallocated key/value buffers; when gradients are on, empty ones that grow by
        concatenation (in-place writes would invalidate tensors autograd saved)."""
        d, h = self.cfg.d_model, self.cfg.n_heads
        length = 0 if torch.is_grad_enabled() else self.max_len + 1
        shape = (n, h, length, d // h)
        return [[torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype)]
                for _ in self.layers]

    def forward(self, att: torch.Tensor, fc: torch.Tensor, att_mask: torch.Tensor, labels: torch.Tensor | None = None,
                sample_k: int = 0, temperature: float = 1.0, top_k: int = 0):
        """Teacher forcing: labels [B, S, L] (S captions per image) -> logits [B*S, L+1, V+1]
        predicting w1..wL then EOS. With sample_k > 0 instead: K sampled captions per image with
        differentiable log-probs (a Decoded). Both go through forward so that a DDP wrapper sees them."""
        if sample_k:
            from captioner.decoding import sample

            return sample(self, att, fc, att_mask, k=sample_k, temperature=temperature, top_k=top_k)
        b, s, _ = labels.shape
        memory, mask = self.encode(att, fc, att_mask)
        mem_kv = [(k.repeat_interleave(s, 0), v.repeat_interleave(s, 0)) for k, v in self.memory_kv(memory)]
        flat = labels.reshape(b * s, -1)
        inputs = torch.cat([flat.new_zeros(b * s, 1), flat], dim=1)
        return self.decode(inputs, mem_kv, mask.repeat_interleave(s, 0))


def targets_and_mask(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """labels [N, L] -> targets [N, L+1] (words then EOS=0) and the mask of positions up to the EOS."""
    targets = torch.cat([labels, labels.new_zeros(labels.shape[0], 1)], dim=1)
    lengths = (labels > 0).sum(dim=1)
    mask = torch.arange(targets.shape[1], device=labels.device)[None] <= lengths[:, None]
    return targets, mask


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
