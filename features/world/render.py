"""Rendering a scene to an RGB image with PIL, anti-aliased by supersampling."""

from __future__ import annotations

import functools
import math

import numpy as np
from PIL import Image, ImageDraw

from features.world import lexicon
from features.world.scene import Scene, WorldObject

SUPERSAMPLE = 4


def render(scene: Scene, rng: np.random.Generator) -> Image.Image:
    big = scene.image_size * SUPERSAMPLE
    canvas = Image.fromarray(_background(scene, rng, big))
    for obj in scene.objects:
        mask = Image.new("L", (big, big), 0)
        ImageDraw.Draw(mask).polygon(_outline(obj), fill=255)
        canvas.paste(_texture(obj, big), (0, 0), mask)
    image = canvas.resize((scene.image_size, scene.image_size), Image.Resampling.BOX)
    return _add_noise(image, rng)


def _background(scene: Scene, rng: np.random.Generator, big: int) -> np.ndarray:
    # A soft linear gradient in a random direction, so backgrounds vary beyond their colour.
    angle = rng.uniform(0, 2 * math.pi)
    ramp = np.linspace(-1, 1, big)
    gx, gy = np.meshgrid(ramp, ramp)
    shade = (math.cos(angle) * gx + math.sin(angle) * gy) * rng.uniform(6, 18)
    rgb = np.array(scene.background_rgb, dtype=np.float32)
    return np.clip(rgb[None, None, :] + shade[..., None], 0, 255).astype(np.uint8)


def _add_noise(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    pixels = np.asarray(image, dtype=np.float32)
    pixels = pixels + rng.normal(0, 4.0, size=pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _texture(obj: WorldObject, big: int) -> Image.Image:
    return _texture_image(obj.color, obj.texture, big)


@functools.lru_cache(maxsize=64)
def _texture_image(color_name: str, texture: str, big: int) -> Image.Image:
    # Cached: a texture depends on colour and pattern only, and drawing it was most of a render.
    # Callers only paste from it, never draw on it.
    color = np.array(lexicon.COLORS[color_name], dtype=np.float32)
    if texture == "solid":
        return Image.new("RGB", (big, big), tuple(int(c) for c in color))
    # The second tone is darker for light colours and lighter for dark ones, so stripes show.
    other = color * 0.45 if color.mean() > 110 else color + (255 - color) * 0.55
    period = 3 * SUPERSAMPLE
    yy, xx = np.mgrid[0:big, 0:big]
    if texture == "striped":
        pattern = ((xx + yy) // period) % 2 == 0
    else:  # checkered
        pattern = ((xx // period) + (yy // period)) % 2 == 0
    pixels = np.where(pattern[..., None], color, other)
    return Image.fromarray(pixels.astype(np.uint8))


def _outline(obj: WorldObject) -> list[tuple[float, float]]:
    cx, cy = obj.center[0] * SUPERSAMPLE, obj.center[1] * SUPERSAMPLE
    r = obj.radius * SUPERSAMPLE
    shape = obj.shape
    if shape == "circle":
        return _regular(cx, cy, r, 48, 0.0)
    if shape == "square":
        s = r * 0.86
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if shape == "triangle":
        return _regular(cx, cy + r * 0.15, r * 1.05, 3, -math.pi / 2)
    if shape == "diamond":
        return [(cx, cy - r), (cx + r * 0.8, cy), (cx, cy + r), (cx - r * 0.8, cy)]
    if shape == "hexagon":
        return _regular(cx, cy, r, 6, 0.0)
    if shape == "star":
        outer = _regular(cx, cy, r, 5, -math.pi / 2)
        inner = _regular(cx, cy, r * 0.45, 5, -math.pi / 2 + math.pi / 5)
        return [p for pair in zip(outer, inner, strict=True) for p in pair]
    if shape == "cross":
        a, b = r * 0.33, r
        return [(cx - a, cy - b), (cx + a, cy - b), (cx + a, cy - a), (cx + b, cy - a),
                (cx + b, cy + a), (cx + a, cy + a), (cx + a, cy + b), (cx - a, cy + b),
                (cx - a, cy + a), (cx - b, cy + a), (cx - b, cy - a), (cx - a, cy - a)]
    raise ValueError(f"unknown shape {shape!r}")


def _regular(cx: float, cy: float, r: float, n: int, start: float) -> list[tuple[float, float]]:
    return [(cx + r * math.cos(start + 2 * math.pi * k / n), cy + r * math.sin(start + 2 * math.pi * k / n))
            for k in range(n)]
