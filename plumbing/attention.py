"""Scaled dot-product attention for batches whose shapes change from step to step.

Texts here run trimmed to their batch's (or length group's) longest, and decoding grows its keys one
step at a time, so attention sees a new shape most calls. On a GPU, PyTorch may pick cuDNN's attention,
which builds a graph for each new shape: on an H200 (PyTorch 2.11) 62 ms a call on new shapes against
0.59 ms on shapes seen before, while the memory-efficient kernel took 0.94 ms on new ones; two world-CLIP
contrastive epochs there (73 s) spent 30 s in attention's forward alone (docs/lab_book.md, "cuDNN
attention on a GPU"). `attend` (and `varying_shapes` around modules we do not own) leaves cuDNN's backend out on CUDA
tensors and is plain `scaled_dot_product_attention` everywhere else.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Every backend but cuDNN's, in PyTorch's own order of preference among them.
VARYING_SHAPE_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def attention_backends(device: torch.device) -> tuple[SDPBackend, ...] | None:
    """The backends attention may use on `device` here; None: PyTorch's own choice (no cuDNN there)."""
    return VARYING_SHAPE_BACKENDS if device.type == "cuda" else None


def varying_shapes(device: torch.device) -> AbstractContextManager:
    """A context in which attention on `device` leaves cuDNN's backend out, for code that calls it
    through modules we do not own (open_clip's `nn.MultiheadAttention` blocks)."""
    backends = attention_backends(device)
    return nullcontext() if backends is None else sdpa_kernel(list(backends))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
           dropout_p: float = 0.0, is_causal: bool = False) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, ...)`, without cuDNN's per-shape graphs on a GPU."""
    with varying_shapes(q.device):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
