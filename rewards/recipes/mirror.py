"""Mirrored views for contrastive training: an image flipped left-right and/or top-bottom, with its
texts rewritten to say what the flipped image shows ("left" <-> "right", "above" <-> "below").

A flip maps every true statement about positions to a true statement about the flipped image
and every false one to a false one, so a caption and its hard negatives stay what they were. Put
an image and its mirror in the same batch (`pairs`) and the only thing that tells them apart is
where things are: the contrastive loss then has to learn places and relations, which in-batch
negatives of different scenes almost never test. `random` flips without the twin, which only
balances the words (no caption prior for "left" over "right").
"""

from __future__ import annotations

import random
import re
from itertools import combinations
from typing import Literal

from PIL import Image, ImageOps

MirrorMode = Literal["none", "random", "pairs"]
AXES = ("horizontal", "vertical")

_SWAPS = {
    "horizontal": {"left": "right", "right": "left"},
    "vertical": {"top": "bottom", "bottom": "top", "above": "below", "below": "above", "over": "under",
                 "under": "over", "beneath": "over", "upper": "lower", "lower": "upper"},
}
_WORD = re.compile(r"[A-Za-z]+")


def mirror_text(text: str, axes: tuple[str, ...]) -> str:
    """The text with the position words of each flipped axis swapped, keeping their capitals."""
    swaps = {k: v for axis in axes for k, v in _SWAPS[axis].items()}

    def swap(match: re.Match) -> str:
        word = match.group(0)
        new = swaps.get(word.lower())
        if new is None:
            return word
        return new.upper() if word.isupper() and len(word) > 1 else new.capitalize() if word[0].isupper() else new

    return _WORD.sub(swap, text)


def mirror_image(image: Image.Image, axes: tuple[str, ...]) -> Image.Image:
    if "horizontal" in axes:
        image = ImageOps.mirror(image)
    if "vertical" in axes:
        image = ImageOps.flip(image)
    return image


def flips(allowed: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every non-empty set of the allowed axes."""
    axes = [a for a in AXES if a in allowed]
    return [combo for k in range(1, len(axes) + 1) for combo in combinations(axes, k)]


def twin_axes(texts: list[str], allowed: tuple[str, ...], rng: random.Random) -> tuple[str, ...]:
    """The flip for an image's twin: one that changes its caption when there is one (a twin whose
    caption reads the same teaches nothing about positions), else any."""
    options = flips(allowed)
    changing = [axes for axes in options if mirror_text(texts[0], axes) != texts[0]] if texts else []
    return rng.choice(changing or options)


def random_axes(allowed: tuple[str, ...], rng: random.Random) -> tuple[str, ...]:
    """Each allowed axis flipped with probability 1/2 (possibly none)."""
    return tuple(axis for axis in AXES if axis in allowed and rng.random() < 0.5)
