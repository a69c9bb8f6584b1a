"""The one device rule every command follows: `auto` means the GPU when present, else the CPU."""

from __future__ import annotations

import torch


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
