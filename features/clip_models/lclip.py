"""The L-CLIP student of L-CLIPScore (papers/l_clipscore_paper.md, Fig. 2a).

Both towers are built from weight-multiplexed blocks: one shared block (attention `qkv`/`proj`
and MLP `fc1`/`fc2`) is run `repeats` times in a row, each run with its own LayerNorms
(`norm1.instances.<r>`, `norm2.instances.<r>`), as in DistillCLIP's MiniViT-style
RepeatedMiniBlock. The text tower factorises the token embedding into vocab×rank then
rank×width (rank 256 in the paper). DistillCLIP saves a Lightning checkpoint whose
`state_dict` holds the student under `student.` (and the teacher under `teacher.`).
The architecture is read from the tensor shapes; only the head counts are not: a checkpoint may name them
in Lightning's `hyper_parameters` (`vision_heads`, `text_heads`; rewards.distill_lclip writes them, since a
student keeps its teacher's text heads), else they are width // 64 unless the caller says. The image
tower starts with a patch projection (`conv1`, as DistillCLIP) or, for small images whose shapes a
patch projection cannot see, a few stride-2 convolutions (`stem`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from features.clip_models.checkpoints import load_into, load_weights_file, unwrap_state_dict
from plumbing.attention import attend
from plumbing.errors import DataError

STUDENT_PREFIX = "student."


@dataclass
class LClipConfig:
    embed_dim: int = 512
    image_size: int = 224
    patch_size: int = 32
    vision_width: int = 768
    vision_layers: int = 6  # counted after multiplexing: 3 shared blocks × 2
    vision_heads: int = 12
    context_length: int = 77
    vocab_size: int = 49408
    embed_rank: int = 256
    text_width: int = 512
    text_layers: int = 4
    text_heads: int = 8
    repeats: int = 2
    stem_channels: tuple[int, ...] = ()  # () = a patch stem; else 3x3 stride-2 convs with these widths first
    stem_norm: bool = False  # a BatchNorm after each of those convs but the last


class MultiplexAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, causal: bool, queries: torch.Tensor | None = None) -> torch.Tensor:
        """Attention over x [B, L, width]; with `queries` [B, Q] (positions), only those positions'
        outputs [B, Q, width], every position still a key and a value."""
        batch, length, width = x.shape
        head_width = width // self.heads
        if queries is None:
            q, k, v = self.qkv(x).view(batch, length, 3, self.heads, head_width).permute(2, 0, 3, 1, 4)
            out = attend(q, k, v, is_causal=causal)
        else:
            k, v = F.linear(x, self.qkv.weight[width:], self.qkv.bias[width:]).view(
                batch, length, 2, self.heads, head_width).permute(2, 0, 3, 1, 4)
            picked = x.gather(1, queries[:, :, None].expand(-1, -1, width))
            q = F.linear(picked, self.qkv.weight[:width], self.qkv.bias[:width]).view(
                batch, queries.shape[1], self.heads, head_width).transpose(1, 2)
            seen = (torch.arange(length, device=x.device) <= queries[:, :, None])[:, None] if causal else None
            out = attend(q, k, v, attn_mask=seen)
        return self.proj(out.transpose(1, 2).reshape(batch, out.shape[2], width))


class RepeatedNorm(nn.Module):
    def __init__(self, width: int, repeats: int):
        super().__init__()
        self.instances = nn.ModuleList(nn.LayerNorm(width) for _ in range(repeats))


class MultiplexedBlock(nn.Module):
    """One shared pre-norm Transformer block applied `repeats` times, each with its own norms."""

    def __init__(self, width: int, heads: int, repeats: int):
        super().__init__()
        self.norm1, self.norm2 = RepeatedNorm(width, repeats), RepeatedNorm(width, repeats)
        self.attn = MultiplexAttention(width, heads)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, causal: bool, queries: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, L, width] through the block's runs; with `queries` [B, Q], the last run computes only
        those positions (the tower's pooled ones) and returns [B, Q, width]: the same values there."""
        runs = list(zip(self.norm1.instances, self.norm2.instances, strict=True))
        for k, (norm1, norm2) in enumerate(runs):
            if queries is not None and k == len(runs) - 1:
                attended = self.attn(norm1(x), causal, queries)
                x = x.gather(1, queries[:, :, None].expand(-1, -1, x.shape[2])) + attended
            else:
                x = x + self.attn(norm1(x), causal)
            x = x + self.fc2(F.gelu(self.fc1(norm2(x))))
        return x


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, causal: bool, queries: torch.Tensor | None = None
               ) -> torch.Tensor:
    """x through the tower's blocks; with `queries`, the last block's last run only at those positions
    (all that a pooled embedding reads: two of its twelve width-squared products per other token)."""
    for k, block in enumerate(blocks):
        x = block(x, causal, queries if k == len(blocks) - 1 else None)
    return x


def _blocks(width: int, layers: int, heads: int, repeats: int) -> nn.ModuleList:
    if layers % repeats:
        raise DataError(f"{layers} layers cannot be multiplexed {repeats} times")
    return nn.ModuleList(MultiplexedBlock(width, heads, repeats) for _ in range(layers // repeats))


def stem_stride(channels: Sequence[int]) -> int:
    """The side a conv stem divides images by: its convs (one per channel width, then one to the
    tower width) each halve it."""
    return 2 ** (len(channels) + 1)


def conv_stem(channels: tuple[int, ...], width: int, norm: bool = False) -> nn.Sequential:
    """3x3 stride-2 convolutions, GELU between them (after a BatchNorm with `norm`): each halves the
    side, the last gives `width` channels and feeds the tower's LayerNorm directly. Shapes a patch
    projection cannot see at small image sizes are seen by a few convolutions."""
    layers: list[nn.Module] = []
    for c_in, c_out in itertools.pairwise((3, *channels)):
        layers.append(nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=not norm))
        layers += [nn.BatchNorm2d(c_out), nn.GELU()] if norm else [nn.GELU()]
    layers.append(nn.Conv2d(channels[-1], width, 3, stride=2, padding=1))
    return nn.Sequential(*layers)


class LClipVision(nn.Module):
    def __init__(self, cfg: LClipConfig):
        super().__init__()
        width, grid = cfg.vision_width, cfg.image_size // cfg.patch_size
        if cfg.stem_channels:
            if stem_stride(cfg.stem_channels) != cfg.patch_size:
                raise DataError(f"a stem of {len(cfg.stem_channels) + 1} stride-2 convs has stride "
                                f"{stem_stride(cfg.stem_channels)}, not the patch size {cfg.patch_size}")
            self.stem = conv_stem(cfg.stem_channels, width, cfg.stem_norm)
        else:
            self.conv1 = nn.Conv2d(3, width, cfg.patch_size, cfg.patch_size, bias=False)
        self.class_embedding = nn.Parameter(torch.zeros(width))
        self.positional_embedding = nn.Parameter(torch.randn(grid * grid + 1, width) * width ** -0.5)
        self.ln_pre = nn.LayerNorm(width)
        self.blocks = _blocks(width, cfg.vision_layers, cfg.vision_heads, cfg.repeats)
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(torch.randn(width, cfg.embed_dim) * width ** -0.5)

    def tokens(self, images: torch.Tensor, class_only: bool = False) -> torch.Tensor:
        """The last block's output [B, 1 + grid², width]: the class token, then the patches row by row
        (`class_only`: the class token's alone, [B, 1, width], the rest of the last run left out)."""
        x = (self.stem(images) if hasattr(self, "stem") else self.conv1(images)).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(x.shape[0], 1, -1).to(x.dtype)
        x = self.ln_pre(torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype))
        queries = torch.zeros(x.shape[0], 1, dtype=torch.long, device=x.device) if class_only else None
        return run_blocks(self.blocks, x, False, queries)

    def pooled(self, images: torch.Tensor) -> torch.Tensor:
        """The normed class token [B, width], before the projection."""
        return self.ln_post(self.tokens(images, class_only=True)[:, 0])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.pooled(images) @ self.proj


class LClipText(nn.Module):
    def __init__(self, cfg: LClipConfig):
        super().__init__()
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.embed_rank)
        self.token_projection = nn.Linear(cfg.embed_rank, cfg.text_width, bias=False)
        self.positional_embedding = nn.Parameter(torch.randn(cfg.context_length, cfg.text_width) * 0.01)
        self.blocks = _blocks(cfg.text_width, cfg.text_layers, cfg.text_heads, cfg.repeats)
        self.ln_final = nn.LayerNorm(cfg.text_width)
        self.text_projection = nn.Parameter(torch.randn(cfg.text_width, cfg.embed_dim) * cfg.text_width ** -0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, L] with L <= context; causal, so trailing padding never changes the EOT row."""
        x = self.token_projection(self.token_embedding(tokens)) + self.positional_embedding[: tokens.shape[1]]
        x = run_blocks(self.blocks, x, True, tokens.argmax(dim=-1)[:, None])
        return self.ln_final(x[:, 0]) @ self.text_projection


class LClip(nn.Module):
    def __init__(self, cfg: LClipConfig):
        super().__init__()
        self.config = cfg
        self.image_encoder = LClipVision(cfg)
        self.text_encoder = LClipText(cfg)
        self.logit_scale = nn.Parameter(torch.tensor(2.6593))  # log(1/0.07), as CLIP

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return self.image_encoder(images)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.text_encoder(tokens)


def student_state(state: dict[str, torch.Tensor], source: str | Path) -> dict[str, torch.Tensor]:
    """The `student.` entries of a DistillCLIP checkpoint (a bare student state dict passes through)."""
    if not any(k.startswith(STUDENT_PREFIX) for k in state):
        return state
    return {k[len(STUDENT_PREFIX):]: v for k, v in state.items() if k.startswith(STUDENT_PREFIX)}


def default_heads(width: int) -> int:
    """Attention heads of a tower whose checkpoint names none: DistillCLIP's (and OpenAI's) width // 64."""
    return max(1, width // 64)


def infer_config(state: dict[str, torch.Tensor], source: str | Path, vision_heads: int = 0, text_heads: int = 0,
                 repeats: int = 0) -> LClipConfig:
    """The student's shape from its weights; `repeats` 0 reads it off the per-run norms of the first block
    (each run of a shared block has its own), a given value must agree with them; head counts 0 are
    `default_heads`, and any head count must divide its tower's width."""
    stem = stem_shapes(state)
    repeats = repeats or count_repeats(state)
    try:
        conv = state["image_encoder.conv1.weight"] if not stem else None
        vision_pos = state["image_encoder.positional_embedding"]
        tokens, token_proj = state["text_encoder.token_embedding.weight"], state["text_encoder.token_projection.weight"]
        text_pos, projection = state["text_encoder.positional_embedding"], state["text_encoder.text_projection"]
    except KeyError as exc:
        raise DataError(f"{source}: not an L-CLIP student checkpoint: missing keys {exc}") from None
    grid = round((vision_pos.shape[0] - 1) ** 0.5)
    vision_width, text_width = vision_pos.shape[1], token_proj.shape[0]
    vision_heads, text_heads = vision_heads or default_heads(vision_width), text_heads or default_heads(text_width)
    for width, heads, key in ((vision_width, vision_heads, "vision_heads"), (text_width, text_heads, "text_heads")):
        if width % heads:
            raise DataError(f"{source}: {key} {heads} does not divide the tower's width {width}")
    patch = stem_stride(stem[:-1]) if stem else conv.shape[-1]
    return LClipConfig(
        embed_dim=projection.shape[1], image_size=grid * patch, patch_size=patch,
        stem_channels=tuple(stem[:-1]), stem_norm=any(k.endswith(".running_mean") for k in state
                                                      if k.startswith("image_encoder.stem.")),
        vision_width=vision_width, vision_layers=_count_blocks(state, "image_encoder") * repeats,
        vision_heads=vision_heads, context_length=text_pos.shape[0],
        vocab_size=tokens.shape[0], embed_rank=tokens.shape[1], text_width=text_width,
        text_layers=_count_blocks(state, "text_encoder") * repeats,
        text_heads=text_heads, repeats=repeats,
    )


def stem_shapes(state: dict[str, torch.Tensor]) -> list[int]:
    """Output channels of the conv stem's convolutions (empty for a patch stem); a BatchNorm's
    weight is 1-D, a convolution's 4-D."""
    convs = sorted(int(k.split(".")[2]) for k in state
                   if k.startswith("image_encoder.stem.") and k.endswith(".weight") and state[k].dim() == 4)
    return [state[f"image_encoder.stem.{i}.weight"].shape[0] for i in convs]


def count_repeats(state: dict[str, torch.Tensor], default: int = 2) -> int:
    """Runs of each shared block: how many norms the image tower's first block keeps per position
    (`default` for weights without them, which no L-CLIP layout here loads)."""
    return len(_indices(state, "image_encoder.blocks.0.norm1.instances.")) or default


def _count_blocks(state: dict[str, torch.Tensor], tower: str) -> int:
    return len(_indices(state, f"{tower}.blocks."))


def _indices(state: dict[str, torch.Tensor], prefix: str) -> set[str]:
    """The distinct indices right after `prefix` among the keys (the entries of a ModuleList there)."""
    return {k[len(prefix):].split(".")[0] for k in state if k.startswith(prefix)}


HEAD_KEYS = ("vision_heads", "text_heads")


def heads_entry(cfg: LClipConfig) -> dict[str, int]:
    """The head counts as a checkpoint's `hyper_parameters` keep them (`stored_heads` reads them back)."""
    return {key: getattr(cfg, key) for key in HEAD_KEYS}


def stored_heads(checkpoint: object, source: str | Path) -> dict[str, int]:
    """The head counts a checkpoint's `hyper_parameters` name ({} when it names none)."""
    hyper = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if not isinstance(hyper, dict):
        return {}
    heads = {}
    for key in HEAD_KEYS:
        if key not in hyper:
            continue
        value = hyper[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(f"{source}: hyper_parameters.{key} must be a positive integer, got {value!r}")
        heads[key] = value
    return heads


def load_lclip(path: str | Path, vision_heads: int = 0, text_heads: int = 0, repeats: int = 0,
               context_length: int | None = None) -> LClip:
    """Build the student from a DistillCLIP Lightning checkpoint (or a bare student state dict); `repeats`
    0 reads the runs of each shared block off the checkpoint, head counts 0 the checkpoint's
    `hyper_parameters` (else width // 64)."""
    checkpoint = load_weights_file(path)
    state = student_state(unwrap_state_dict(checkpoint, path), path)
    stored = stored_heads(checkpoint, path)
    cfg = infer_config(state, path, vision_heads or stored.get("vision_heads", 0),
                       text_heads or stored.get("text_heads", 0), repeats)
    if context_length is not None and cfg.context_length != context_length:
        raise DataError(f"{path}: checkpoint has {cfg.context_length} text positions, the config expects "
                        f"context_length {context_length}")
    model = LClip(cfg)
    load_into(model, state, path)
    return model.eval()
