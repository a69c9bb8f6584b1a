"""An open_clip image tower's last feature map: what a ResNet's attention pool reads, or a ViT's
last patch tokens as a grid. Read by the student's hints (feature_hints) and the scene labels of
each place (scene_labels)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from plumbing.errors import ConfigError
from rewards.recipes.loop import to_channels_last


def last_map(visual: nn.Module, option: str, embedding: bool = True
             ) -> Callable[[torch.Tensor], dict[str, torch.Tensor]]:
    """images -> {"map": the last feature map [B, C, h, w], "embedding": the tower's output [B, d]
    (with `embedding`; else the pool is skipped)} in one forward. `option` names the config key that
    needs it, for the error."""
    if not hasattr(visual, "forward_intermediates"):
        raise ConfigError(f"{option}: the image tower ({type(visual).__name__}) does not give its feature maps "
                          "(open_clip's ResNet and ViT towers do)")

    def forward(images: torch.Tensor) -> dict[str, torch.Tensor]:
        out = visual.forward_intermediates(to_channels_last(images), indices=1, intermediates_only=not embedding)
        return {"map": out["image_intermediates"][-1], **({"embedding": out["image_features"]} if embedding else {})}

    return forward


def image_side(visual: nn.Module) -> int:
    """The side of the square images an open_clip image tower takes (its `image_size`: an int or a pair)."""
    size = visual.image_size
    return int(size[0] if isinstance(size, (tuple, list)) else size)


@torch.no_grad()
def last_map_shape(visual: nn.Module, option: str, device: torch.device | str = "cpu") -> tuple[int, int]:
    """(channels, side) of the tower's last map, from one blank image (in eval mode, so batch norms
    keep their statistics)."""
    side = image_side(visual)
    was_training = visual.training
    visual.eval()
    grid = last_map(visual, option, embedding=False)(torch.zeros(1, 3, side, side, device=device))["map"]
    visual.train(was_training)
    return int(grid.shape[1]), int(grid.shape[-1])
