"""Attention for shapes that change every batch: no cuDNN graphs per shape on a GPU, same outputs."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from features.clip_models.factory import clip_text_forward
from plumbing.attention import attend, attention_backends, varying_shapes

ROOT = Path(__file__).resolve().parents[1]


def test_attend_is_sdpa_on_the_cpu():
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 8) for _ in range(3))
    mask = torch.rand(3, 1, 7, 7) > 0.4
    mask[..., 0] = True
    assert torch.equal(attend(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert torch.equal(attend(q, k, v, is_causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_cuda_leaves_cudnn_out_and_keeps_a_kernel_for_masks():
    backends = attention_backends(torch.device("cuda", 0))
    assert SDPBackend.CUDNN_ATTENTION not in backends
    assert SDPBackend.EFFICIENT_ATTENTION in backends and SDPBackend.MATH in backends
    assert attention_backends(torch.device("cpu")) is None


def test_varying_shapes_switches_cudnn_off_only_inside_and_only_for_cuda():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with varying_shapes(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with varying_shapes(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_open_clip_text_forward_runs_inside_the_context(monkeypatch):
    """open_clip's own blocks call attention on our trimmed lengths: the trimmed forward enters the
    context for the tokens' device."""
    import features.clip_models.factory as factory
    from features.clip_models.open_clip_models import load_open_clip
    from tests.clip_fixtures import TINY_ARCH

    seen = []

    def spy(device):
        seen.append(torch.device(device).type)
        return varying_shapes(device)

    monkeypatch.setattr(factory, "varying_shapes", spy)
    model = load_open_clip(TINY_ARCH).model.eval()
    tokens = torch.zeros(2, 5, dtype=torch.long)
    tokens[:, 0], tokens[:, 1:3], tokens[:, 3] = 1, 7, 9
    clip_text_forward(model)(tokens)
    assert seen == ["cpu"]


def test_every_attention_call_goes_through_attend():
    """A direct `scaled_dot_product_attention` call would let cuDNN back on a GPU."""
    direct = []
    for folder in ("plumbing", "features", "rewards", "captioner"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "plumbing" / "attention.py":
                continue
            if re.search(r"scaled_dot_product_attention\(", path.read_text()):
                direct.append(str(path.relative_to(ROOT)))
    assert direct == []
