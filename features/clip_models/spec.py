"""How a config names a reward model (kept free of heavy imports: configs load it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The world CLIP's open_clip architecture (features/clip_models/model_configs/): the default of the
# commands that measure it, so a new world CLIP arch changes here and in the world's configs only.
WORLD_CLIP_ARCH = "world-clip-rn16-e256-h4"


@dataclass
class RewardModelSpec:
    kind: Literal["open_clip", "longclip", "lclip"] = "open_clip"
    arch: str = "ViT-B-32"  # open_clip architecture (kind open_clip)
    weights: str | None = None  # weights file; for open_clip also a hub tag; None = random init (tests)
    embeds: str = ""  # embeds/<key>.h5 with this model's image embeddings (features.extract)
    context_length: int | None = None  # expected text positions; a checkpoint with others is an error
    precision: Literal["auto", "fp32", "fp16", "bf16"] = "auto"  # auto: fp16 on GPU, fp32 on CPU
    token_budget: int = 8192  # tokens per text micro-batch (rows × trimmed length)
    cache_size: int = 100_000  # LRU entries for reference and noun embeddings
    heads: int = 0  # lclip: attention heads per tower (0 = width // 64)
    repeats: int = 0  # lclip: runs of each shared block (0: read off the checkpoint)
    grammar: str | None = None  # a grammar head on this model's text embeddings (rewards.train_grammar)
