"""Counterfactual scenes: an image's scene with one fact changed, so that a caption true of the
image is false of the edited scene (hard *image* negatives: the caption must rank its own image
above a picture that differs from it in one thing).

Edits change the scene, not a caption: an object's shape, colour, size or texture, where it
stands, two objects swapped, an object removed or added, the background. Geometry is redrawn
from the world's own rules (places from the 3x3 grid, relations from the centres), and every
edited scene is checked with the parser against the caption: one the caption does not
contradict is never returned. `rerender` draws the edited scene with the original image's
background and noise when the world's seed reproduces its scene, so the pair differs only in the
edited fact.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
from PIL import Image

from features.world import lexicon
from features.world.parse import CaptionClaims, contradictions
from features.world.render import render
from features.world.scene import Scene, WorldObject, place_name, relations_between, sample_scene

EDITS = ("shape", "color", "size", "texture", "move", "swap", "remove", "add", "background")
PLACEMENT_TRIES = 50


def counterfactual(scene: Scene, claims: CaptionClaims, rng: random.Random, tries: int = 12) -> Scene | None:
    """A scene one edit away from `scene` that the caption's claims contradict (None if no try found one)."""
    for _ in range(tries):
        kind = rng.choice(EDITS)
        edited = _EDIT[kind](scene, rng)
        if edited is not None and contradictions(claims, edited):
            return edited
    return None


def rerender(original: Scene, edited: Scene, world_seed: int | None, index: int) -> Image.Image:
    """The edited scene's image, drawn with the original image's random stream (its background
    gradient and noise) when the world's generator reproduces the original scene from
    (seed, index) for some `max_objects`; otherwise with a stream of its own."""
    if world_seed is not None:
        for max_objects in range(4, 0, -1):
            rng = np.random.default_rng([world_seed, index])
            if _same_objects(sample_scene(rng, original.image_size, max_objects), original):
                return render(edited, rng)
    return render(edited, np.random.default_rng([index, 1]))


def _same_objects(a: Scene, b: Scene) -> bool:
    return a.background == b.background and [(o.shape, o.color, o.center) for o in a.objects] == \
        [(o.shape, o.color, o.center) for o in b.objects]


def rebuilt(scene: Scene, objects: list[WorldObject], **changes) -> Scene:
    """The scene with these objects, their places, boxes and relations redrawn from their centres."""
    size = scene.image_size
    placed = [replace(o, place=place_name(*o.center, size), bbox=_bbox(o.center, o.radius)) for o in objects]
    relations = [{"subject": a.id, "relation": rel, "object": b.id}
                 for a in placed for b in placed if a.id != b.id for rel in relations_between(a, b, size)]
    return replace(scene, objects=placed, relations=relations, **changes)


def _bbox(center: tuple[float, float], radius: float) -> tuple[int, int, int, int]:
    x, y = center
    return int(x - radius), int(y - radius), int(math.ceil(x + radius)), int(math.ceil(y + radius))


def _fits(center: tuple[float, float], radius: float, others: list[WorldObject], size: int) -> bool:
    x, y = center
    border, gap = radius + 1.5, 0.04 * size
    inside = border <= x <= size - border and border <= y <= size - border
    return inside and all(math.hypot(x - o.center[0], y - o.center[1]) > radius + o.radius + gap for o in others)


def _free_center(radius: float, others: list[WorldObject], size: int, rng: random.Random,
                 avoid_place: str | None = None) -> tuple[float, float] | None:
    border = radius + 1.5
    for _ in range(PLACEMENT_TRIES):
        center = (round(rng.uniform(border, size - border), 2), round(rng.uniform(border, size - border), 2))
        if _fits(center, radius, others, size) and place_name(*center, size) != avoid_place:
            return center
    return None


def _kinds_in_use(scene: Scene) -> set[tuple[str, str]]:
    return {(o.shape, o.color) for o in scene.objects}


def _with(scene: Scene, k: int, obj: WorldObject) -> Scene:
    return rebuilt(scene, [obj if i == k else o for i, o in enumerate(scene.objects)])


def _shape(scene: Scene, rng: random.Random) -> Scene | None:
    k = rng.randrange(len(scene.objects))
    obj = scene.objects[k]
    options = [s for s in lexicon.SHAPES if (s, obj.color) not in _kinds_in_use(scene)]
    return _with(scene, k, replace(obj, shape=rng.choice(options))) if options else None


def _color(scene: Scene, rng: random.Random) -> Scene | None:
    k = rng.randrange(len(scene.objects))
    obj = scene.objects[k]
    options = [c for c in lexicon.COLORS if (obj.shape, c) not in _kinds_in_use(scene)]
    return _with(scene, k, replace(obj, color=rng.choice(options))) if options else None


def _size(scene: Scene, rng: random.Random) -> Scene | None:
    k = rng.randrange(len(scene.objects))
    obj = scene.objects[k]
    size = "small" if obj.size == "large" else "large"
    radius = round(lexicon.SIZES[size] * scene.image_size / 2, 2)
    others = [o for i, o in enumerate(scene.objects) if i != k]
    if not _fits(obj.center, radius, others, scene.image_size):
        return None
    return _with(scene, k, replace(obj, size=size, radius=radius))


def _texture(scene: Scene, rng: random.Random) -> Scene | None:
    k = rng.randrange(len(scene.objects))
    obj = scene.objects[k]
    return _with(scene, k, replace(obj, texture=rng.choice([t for t in lexicon.TEXTURES if t != obj.texture])))


def _move(scene: Scene, rng: random.Random) -> Scene | None:
    k = rng.randrange(len(scene.objects))
    obj = scene.objects[k]
    others = [o for i, o in enumerate(scene.objects) if i != k]
    center = _free_center(obj.radius, others, scene.image_size, rng, avoid_place=obj.place)
    return None if center is None else _with(scene, k, replace(obj, center=center))


def _swap(scene: Scene, rng: random.Random) -> Scene | None:
    if len(scene.objects) < 2:
        return None
    i, j = rng.sample(range(len(scene.objects)), 2)
    a, b = scene.objects[i], scene.objects[j]
    objects = list(scene.objects)
    objects[i], objects[j] = replace(a, center=b.center), replace(b, center=a.center)
    rest = [o for n, o in enumerate(objects) if n not in (i, j)]
    if not (_fits(objects[i].center, a.radius, rest + [objects[j]], scene.image_size)
            and _fits(objects[j].center, b.radius, rest, scene.image_size)):
        return None
    return rebuilt(scene, objects)


def _remove(scene: Scene, rng: random.Random) -> Scene | None:
    if len(scene.objects) < 2:
        return None
    k = rng.randrange(len(scene.objects))
    return rebuilt(scene, [o for i, o in enumerate(scene.objects) if i != k])


def _add(scene: Scene, rng: random.Random) -> Scene | None:
    used = _kinds_in_use(scene)
    kinds = [(s, c) for s in lexicon.SHAPES for c in lexicon.COLORS if (s, c) not in used]
    shape, color = rng.choice(kinds)
    size = rng.choice(list(lexicon.SIZES))
    radius = round(lexicon.SIZES[size] * scene.image_size / 2, 2)
    center = _free_center(radius, scene.objects, scene.image_size, rng)
    if center is None:
        return None
    new = WorldObject(id=max(o.id for o in scene.objects) + 1, shape=shape, color=color, size=size,
                      texture=rng.choice(lexicon.TEXTURES), center=center, radius=radius, place="")
    return rebuilt(scene, [*scene.objects, new])


def _background(scene: Scene, rng: random.Random) -> Scene | None:
    name = rng.choice([b for b in lexicon.BACKGROUNDS if b != scene.background])
    base = np.array(lexicon.BACKGROUNDS[name]) + np.array(scene.background_rgb) - np.array(
        lexicon.BACKGROUNDS[scene.background])  # keep the original's jitter
    rgb = tuple(int(v) for v in np.clip(base, 0, 255))
    return rebuilt(scene, list(scene.objects), background=name, background_rgb=rgb)


_EDIT = {"shape": _shape, "color": _color, "size": _size, "texture": _texture, "move": _move, "swap": _swap,
         "remove": _remove, "add": _add, "background": _background}
