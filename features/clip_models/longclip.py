"""LongCLIP-style checkpoints (SPECS's released `spec.pt`): OpenAI-CLIP key names plus
`positional_embedding_res`, 248 text positions.

The released LongCLIP code adds `positional_embedding * mask1 + positional_embedding_res * mask2`
with mask1 selecting the first 20 rows, so the effective table is `cat(pe[:20], pe_res[20:])`; we
fold that into one table at load time and run an ordinary open_clip CLIP.

The layout has no field for the text tower's heads: OpenAI's builder takes width // 64. A model whose
text tower runs other heads (the world CLIP's four of 32) is written with one more entry, `text_heads`,
and loaded with those heads; the released LongCLIP loader rejects that entry as an unexpected key
rather than misreading the tower, and files at width // 64 heads carry no such entry.
"""

from __future__ import annotations

from pathlib import Path

import torch
from open_clip.model import CLIP, build_model_from_openai_state_dict

from features.clip_models.checkpoints import load_into, load_state_dict_file
from plumbing.errors import ConfigError, DataError

KEEP_POSITIONS = 20  # positions LongCLIP keeps verbatim; the rest are stretched ×4
STRETCH = 4
LONG_CONTEXT = 77 * STRETCH - (STRETCH - 1) * KEEP_POSITIONS  # 248
RESIDUAL_KEY = "positional_embedding_res"
JIT_ONLY_KEYS = ("input_resolution", "context_length", "vocab_size")
HEADS_KEY = "text_heads"


def stretch_positions(table: torch.Tensor, keep: int = KEEP_POSITIONS) -> torch.Tensor:
    """[L, W] -> [4L - 3·keep, W] by the LongCLIP rule: rows < keep copied; between two later rows
    three points linearly interpolated (×4); the last row extrapolated along the final step."""
    length, width = table.shape
    if length <= keep + 1:
        raise ConfigError(f"cannot stretch {length} positions while keeping {keep}")
    steps = torch.arange(STRETCH, dtype=table.dtype).view(1, STRETCH, 1)
    left, right = table[keep:-1].unsqueeze(1), table[keep + 1:].unsqueeze(1)
    middle = (left * (STRETCH - steps) + right * steps) / STRETCH
    last, before = table[-1], table[-2]
    tail = last + steps.view(STRETCH, 1) * (last - before) / STRETCH
    return torch.cat([table[:keep], middle.reshape(-1, width), tail])


def stretch_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CLIP state dict -> a LongCLIP one with 248 positions (both tables start equal, as LongCLIP
    does): a shorter table is stretched by the LongCLIP rule (77 -> 248), a longer one cut to 248."""
    table = state["positional_embedding"]
    if len(table) < LONG_CONTEXT:
        table = stretch_positions(table)
    table = table[:LONG_CONTEXT].clone()
    return {**state, "positional_embedding": table, RESIDUAL_KEY: table.clone()}


def effective_positions(state: dict[str, torch.Tensor], source: str | Path) -> torch.Tensor:
    if RESIDUAL_KEY not in state:
        raise DataError(f"{source}: not a LongCLIP/SPECS checkpoint (no {RESIDUAL_KEY!r} key)")
    base, residual = state["positional_embedding"], state[RESIDUAL_KEY]
    if base.shape != residual.shape:
        raise DataError(f"{source}: positional_embedding {tuple(base.shape)} and {RESIDUAL_KEY} "
                        f"{tuple(residual.shape)} differ in shape")
    return torch.cat([base[:KEEP_POSITIONS], residual[KEEP_POSITIONS:]])


def load_longclip(path: str | Path, context_length: int | None = LONG_CONTEXT) -> CLIP:
    """Build an fp32 open_clip CLIP from a LongCLIP/SPECS state dict file."""
    return longclip_from_state(load_state_dict_file(path), path, context_length)


def longclip_from_state(state: dict[str, torch.Tensor], source: str | Path = "<memory>",
                        context_length: int | None = LONG_CONTEXT) -> CLIP:
    if "positional_embedding" not in state:
        raise DataError(f"{source}: checkpoint does not match a CLIP text tower: missing keys positional_embedding")
    positions = effective_positions(state, source)
    if context_length is not None and positions.shape[0] != context_length:
        raise ConfigError(f"{source}: checkpoint has {positions.shape[0]} text positions, the config expects "
                          f"context_length {context_length}")
    if HEADS_KEY in state and state[HEADS_KEY].numel() != 1:
        raise DataError(f"{source}: {HEADS_KEY} holds {state[HEADS_KEY].numel()} values, not one")
    heads = int(state[HEADS_KEY]) if HEADS_KEY in state else None  # a stored 0 is refused, not ignored
    state = {k: v for k, v in state.items() if k not in (RESIDUAL_KEY, HEADS_KEY, *JIT_ONLY_KEYS)}
    state["positional_embedding"] = positions
    try:
        model = build_model_from_openai_state_dict(dict(state))
    except KeyError as exc:
        raise DataError(f"{source}: checkpoint does not match an OpenAI-CLIP layout: missing keys {exc}") from None
    except RuntimeError as exc:  # torch's strict-load message lists missing and unexpected keys
        raise DataError(f"{source}: checkpoint does not match an OpenAI-CLIP layout: {str(exc)[:1500]}") from None
    model = model.float()  # open_clip casts to fp16 before loading; reload at full precision
    load_into(model, state, source)
    if heads is not None:
        regroup_text_heads(model, heads, source)
    return model.eval()


def text_heads(model: CLIP) -> int:
    return model.transformer.resblocks[0].attn.num_heads


def heads_entry(model: CLIP) -> dict[str, torch.Tensor]:
    """{HEADS_KEY: heads} for a text tower whose heads are not the layout's width // 64, else {}."""
    heads = text_heads(model)
    return {} if heads == model.transformer.width // 64 else {HEADS_KEY: torch.tensor(heads)}


def regroup_text_heads(model: CLIP, heads: int, source: str | Path) -> None:
    """Run the text tower's attention with `heads` heads. The projections' weights do not depend on
    the grouping (head h reads rows h·d to (h+1)·d of each), so only the split changes."""
    width = model.transformer.width
    if heads < 1 or width % heads:
        raise DataError(f"{source}: {HEADS_KEY} {heads} does not divide the text tower's width {width}")
    for block in model.transformer.resblocks:
        block.attn.num_heads, block.attn.head_dim = heads, width // heads


def longclip_state(model: CLIP) -> dict[str, torch.Tensor]:
    """The SPECS/LongCLIP file layout of a model trained with one position table: both tables
    hold it, so cat(pe[:20], pe_res[20:]) gives it back."""
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    state[RESIDUAL_KEY] = state["positional_embedding"].clone()
    return state | heads_entry(model)
