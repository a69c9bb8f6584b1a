"""One factory for the reward models behind the CLIP-family scores.

- `open_clip`: any open_clip architecture, weights from a local file or a hub tag;
- `longclip`: a LongCLIP/SPECS checkpoint (248 text positions);
- `lclip`: the L-CLIP student from a DistillCLIP checkpoint.

Each comes back as a `RewardModel`: unpadded tokenisation with truncation, an image tower, a text
tower that accepts token batches trimmed to their longest sequence, the eval transform and a
fingerprint of the weights (embeds files are checked against it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from open_clip.transform import image_transform

from features.clip_models.checkpoints import fingerprint
from features.clip_models.lclip import load_lclip
from features.clip_models.longclip import LONG_CONTEXT, load_longclip
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.spec import RewardModelSpec
from features.clip_models.text_batches import pooled_block, project_text, supports_pooled_block
from features.clip_models.tokens import ClipTokenizer
from plumbing.attention import varying_shapes
from plumbing.errors import ConfigError


class RewardModel:
    """A dual encoder seen through the interface the scorer needs."""

    def __init__(self, name: str, module: torch.nn.Module, context_length: int,
                 text_forward: Callable[[torch.Tensor], torch.Tensor],
                 image_forward: Callable[[torch.Tensor], torch.Tensor], preprocess: Callable, trims: bool = True,
                 architecture: str = ""):
        self.name = name
        self.module = module.eval()
        self.context_length = context_length
        self.tokenizer = ClipTokenizer(context_length)
        self._text, self._image = text_forward, image_forward
        self.preprocess = preprocess
        self.trims = trims  # False: the text tower needs full-context input (non-causal towers)
        self.fingerprint = fingerprint(module, architecture)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def to(self, device: str | torch.device) -> RewardModel:
        self.module.to(device)
        return self

    def encode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Unnormalised text embeddings; `tokens` [B, L] zero-padded, L <= context."""
        return self._text(tokens)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return self._image(images)


def clip_text_forward(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """open_clip's encode_text on a trimmed batch: positions and causal mask cut to L, and the last
    block run only where the tower pools (`text_batches.pooled_block`) when it is a block that
    function knows.

    Exact: under the causal mask no position attends to later (padding) ones, and the pooled
    row is the EOT, so trimming trailing padding cannot change the output, nor can leaving out
    the last block's work at positions nothing reads.
    """
    pooled_last = supports_pooled_block(model) and getattr(model.transformer, "batch_first", False)

    def forward(tokens: torch.Tensor) -> torch.Tensor:
        with varying_shapes(tokens.device):  # open_clip's blocks see a new length most batches
            return trimmed(tokens)

    def trimmed(tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        cast = model.transformer.get_cast_dtype()
        x = model.token_embedding(tokens).to(cast) + model.positional_embedding[:length].to(cast)
        mask = model.attn_mask[:length, :length]
        eot = tokens.argmax(dim=-1)
        if pooled_last:
            *early, last = model.transformer.resblocks
            for block in early:
                x = block(x, attn_mask=mask)
            seen = torch.arange(length, device=x.device) <= eot[:, None]
            x = model.ln_final(pooled_block(last, x, eot[:, None], seen[:, None, None, :])[:, 0])
        else:
            x = model.ln_final(model.transformer(x, attn_mask=mask))
            x = x[torch.arange(x.shape[0], device=x.device), eot]
        return project_text(model, x)

    return forward


def _trimmable(model: Any) -> bool:
    return (getattr(model, "attn_mask", None) is not None and hasattr(model, "token_embedding")
            and getattr(model, "text_pool_type", "argmax") == "argmax")


def _from_open_clip(spec: RewardModelSpec) -> RewardModel:
    loaded = load_open_clip(spec.arch, spec.weights)
    model = loaded.model
    context = int(getattr(model, "context_length", 77))
    _check_context(spec, context, loaded.source)
    if _trimmable(model):
        text = clip_text_forward(model)
        trims = True
    else:  # e.g. HF text towers: full-context input, open_clip's own forward
        def text(tokens: torch.Tensor) -> torch.Tensor:
            full = torch.nn.functional.pad(tokens, (0, context - tokens.shape[1]))
            return model.encode_text(full)
        trims = False
    return RewardModel(f"open_clip:{spec.arch}", model, context, text, model.encode_image, loaded.preprocess, trims)


def _from_longclip(spec: RewardModelSpec) -> RewardModel:
    if not spec.weights:
        raise ConfigError("reward model kind 'longclip' needs 'weights' (the SPECS/LongCLIP .pt file)")
    model = load_longclip(spec.weights, spec.context_length or LONG_CONTEXT)
    preprocess = image_transform(model.visual.image_size, is_train=False)
    return RewardModel("longclip", model, model.context_length, clip_text_forward(model), model.encode_image,
                       preprocess)


def _from_lclip(spec: RewardModelSpec) -> RewardModel:
    if not spec.weights:
        raise ConfigError("reward model kind 'lclip' needs 'weights' (a DistillCLIP checkpoint)")
    model = load_lclip(spec.weights, spec.heads, spec.heads, spec.repeats, spec.context_length)
    preprocess = image_transform(model.config.image_size, is_train=False)
    return RewardModel("lclip", model, model.config.context_length, model.encode_text, model.encode_image,
                       preprocess, architecture=repr(model.config))


def _check_context(spec: RewardModelSpec, actual: int, source: str) -> None:
    if spec.context_length is not None and spec.context_length != actual:
        raise ConfigError(f"{source}: model has {actual} text positions, the config expects "
                          f"context_length {spec.context_length}")


_BUILDERS = {"open_clip": _from_open_clip, "longclip": _from_longclip, "lclip": _from_lclip}


def load_reward_model(spec: RewardModelSpec, device: str | torch.device = "cpu", fresh: bool = False) -> RewardModel:
    """The model `spec` names, on `device`. Building it draws a random init that its weights then
    replace; those draws come from a forked generator, so loading a reward or metric model never
    moves the caller's random stream (an SCST run samples the same captions whichever metrics it
    loads). Models from weights files are kept for the process (the same file unchanged, the same
    model): the runs of an in-process sweep, its selection and its evaluation load each once. A
    caller that will change the model's weights asks for a `fresh` one."""
    if spec.kind not in _BUILDERS:
        raise ConfigError(f"unknown reward model kind {spec.kind!r}; use one of {', '.join(_BUILDERS)}")
    key = None if fresh else _cache_key(spec, device)
    if key is not None and key in _LOADED:
        _LOADED.move_to_end(key)
        return _LOADED[key]
    with torch.random.fork_rng(devices=[]):  # models are built on the CPU, then moved
        model = _BUILDERS[spec.kind](spec).to(device)
    if key is not None:
        _LOADED[key] = model
        while len(_LOADED) > KEPT_MODELS:
            _LOADED.popitem(last=False)
    return model


KEPT_MODELS = 4
_LOADED: OrderedDict[tuple, RewardModel] = OrderedDict()


def _cache_key(spec: RewardModelSpec, device: str | torch.device) -> tuple | None:
    """Who the model is: its spec's model fields, and its weights file as it is on disk now."""
    if not spec.weights:
        return None  # a random init is not kept: each build is its own draw
    path = Path(spec.weights)
    stamp = (path.stat().st_size, path.stat().st_mtime_ns) if path.is_file() else None
    return (spec.kind, spec.arch, str(path.resolve()) if stamp else spec.weights, stamp, spec.context_length,
            spec.heads, spec.repeats, str(torch.device(device)))


