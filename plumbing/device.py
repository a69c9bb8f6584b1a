"""The one device rule every command follows: `auto` means the GPU when present, else the CPU."""

from __future__ import annotations

import torch

from plumbing.errors import ConfigError


def pick_device(name: str) -> torch.device:
    """`auto`, `cpu`, `cuda` or `cuda:N`; a GPU asked for where none is visible is an error here,
    not a CUDA traceback at the first tensor moved."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device {name!r}: not a device name (auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda":
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not visible or (device.index or 0) >= visible:
            raise ConfigError(f"device {name!r}: {visible} CUDA GPU(s) visible here; use auto or cpu")
    return device
