"""Captions of a scene: five short references in varied wording and one long detailed caption.

The long caption is a sequence of detail units — phrase spans that each add one new fact — and
is exactly `" ".join(units)`, so a unit's position in the caption is recoverable.
"""

from __future__ import annotations

import numpy as np

from features.world import lexicon
from features.world.scene import Scene, WorldObject, dominant_relation

SHORT_PER_IMAGE = 5


def _pick(rng: np.random.Generator, options: tuple[str, ...] | list[str]) -> str:
    return str(options[int(rng.integers(len(options)))])


SOLID_FILL = ("with a solid fill", "filled with one plain color")  # how a long caption states a solid texture


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def noun_phrase(rng: np.random.Generator, obj: WorldObject, size: bool = False, texture: bool = False,
                definite: bool = False) -> str:
    words = []
    if size:
        words.append(_pick(rng, lexicon.SIZE_WORDS[obj.size]))
    words.append(_pick(rng, lexicon.COLOR_WORDS[obj.color]))
    if texture and obj.texture != "solid":
        words.append(_pick(rng, lexicon.TEXTURE_WORDS[obj.texture]))
    words.append(_pick(rng, lexicon.SHAPES[obj.shape]))
    det = "the" if definite else article(words[0])
    return " ".join([det, *words])


def join_list(phrases: list[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def place_phrase(place: str) -> str:
    if place == "center":
        return "in the center"
    if " " in place:
        return f"in the {place} corner"
    return f"on the {place}" if place in ("left", "right") else f"at the {place}"


def reading_order(scene: Scene) -> list[WorldObject]:
    return sorted(scene.objects, key=lambda o: (o.center[0], o.center[1]))


def _listing(rng: np.random.Generator, scene: Scene, **np_kwargs: bool) -> str:
    return join_list([noun_phrase(rng, o, **np_kwargs) for o in reading_order(scene)])


def _t_list(rng, scene):
    return _listing(rng, scene)


def _t_count(rng, scene):
    n = len(scene.objects)
    if n == 1:
        return f"a single {noun_phrase(rng, scene.objects[0]).split(' ', 1)[1]}"
    return f"{lexicon.NUMBER_WORDS[n]} {_pick(rng, ('shapes', 'objects'))}: {_listing(rng, scene)}"


def _t_background(rng, scene):
    return f"{_listing(rng, scene)} on {article(scene.background)} {scene.background} background"


def _t_sizes(rng, scene):
    return _listing(rng, scene, size=True)


def _t_there_is(rng, scene):
    lead = _pick(rng, ("there is", "an image of", "a picture of", "a drawing of"))
    return f"{lead} {_listing(rng, scene, texture=len(scene.objects) <= 2)}"


def _t_relation(rng, scene):
    objs = reading_order(scene)
    if len(objs) == 1:
        return f"{noun_phrase(rng, objs[0])} {place_phrase(objs[0].place)}"
    i, j = rng.choice(len(objs), size=2, replace=False)
    a, b = objs[i], objs[j]
    rel = _pick(rng, lexicon.RELATION_PHRASES[dominant_relation(a, b)])
    text = f"{noun_phrase(rng, a)} {rel} {noun_phrase(rng, b)}"
    rest = [noun_phrase(rng, o) for k, o in enumerate(objs) if k not in (i, j)]
    return text + (" and " + join_list(rest) if rest else "")


def _t_places(rng, scene):
    objs = reading_order(scene)
    if len(objs) > 2:
        return _t_sizes(rng, scene)
    return join_list([f"{noun_phrase(rng, o)} {place_phrase(o.place)}" for o in objs])


TEMPLATES = (_t_list, _t_count, _t_background, _t_sizes, _t_there_is, _t_relation, _t_places)


def short_captions(rng: np.random.Generator, scene: Scene, count: int = SHORT_PER_IMAGE) -> list[str]:
    order = rng.permutation(len(TEMPLATES))[:count]
    return [TEMPLATES[k](rng, scene) for k in order]


def long_caption_units(rng: np.random.Generator, scene: Scene) -> list[str]:
    objs = reading_order(scene)
    n = len(objs)
    units = [
        f"{_pick(rng, ('The image shows', 'This picture contains', 'The scene has'))} "
        + f"{lexicon.NUMBER_WORDS[n]} {'shape' if n == 1 else 'shapes'}",
        f"on {article(scene.background)} {scene.background} background.",
    ]
    for k, obj in enumerate(objs):
        units.append(_capitalise(noun_phrase(rng, obj, size=True)))
        units.append(_texture_unit(rng, obj))
        units.append(f"{_pick(rng, ('sits', 'is placed', 'appears'))} {place_phrase(obj.place)} of the image.")
        if k > 0:
            prev = objs[k - 1]
            rel = _pick(rng, lexicon.RELATION_PHRASES[dominant_relation(obj, prev)])
            units.append(f"It is {rel} {noun_phrase(rng, prev, size=True, definite=True)}.")
    return units


def _texture_unit(rng: np.random.Generator, obj: WorldObject) -> str:
    if obj.texture == "solid":
        return _pick(rng, SOLID_FILL)
    return f"with a {_pick(rng, lexicon.TEXTURE_WORDS[obj.texture])} pattern"


def _capitalise(text: str) -> str:
    return text[0].upper() + text[1:]
