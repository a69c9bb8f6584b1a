"""Attribute facts for the text stage: one object's size, colour, place or texture, or its scene's background
or count, stated against the same words with that attribute changed (docs/lab_book.md, "Size, place and
background pairs"; a count is said without naming an object: "there are three shapes" / "there are two shapes").

The world CLIP's image embedding says how big a lone object is (a linear readout 0.95 on val), yet
its text tower read "a small red disc" against "a large red disc" at chance: the contrastive loss
and the captions' hard negatives never made the size words point where the images differ. These
pairs do for an object's own attributes what the relation pairs do for two objects' relation.

A fact is left out where it is ambiguous: when another object of the scene looks the same (colour
and shape), the changed statement could be true of that one.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from features.world import lexicon
from features.world.captions import article, place_phrase
from features.world.negatives import absent_kind
from features.world.scene import Scene, WorldObject
from plumbing.errors import DataError
from rewards.recipes.data import Split

ATTRIBUTES = ("size", "color", "place", "texture", "background", "count")
SCENE_ATTRIBUTES = ("background", "count")  # one fact a scene, not one an object
LEADS = ("", "", "a picture of ", "there is ", "an image of ")  # how a statement opens (half of them plainly)
COUNT_LEADS = ("", "", "a picture of ", "there are ", "an image of ")  # a count's, plural


class AttributeFact(NamedTuple):
    row: int  # the image's row in the train split
    subject: WorldObject
    attribute: str  # one of ATTRIBUTES
    others: tuple[WorldObject, ...]  # the scene's other objects
    background: str  # the scene's


def attribute_facts(split: Split, scenes: dict[int, Scene], attributes: Sequence[str]) -> list[AttributeFact]:
    """One fact per object of the split's scenes and per object attribute, for every object no other
    object of its scene looks like; the background and the count once a scene, with the first such object."""
    facts = []
    for row, image_id in enumerate(split.image_ids):
        if image_id not in scenes:
            raise DataError(f"text stage: image id {image_id} of the train split has no scene in `scenes`")
        scene = scenes[image_id]
        looks = Counter((o.color, o.shape) for o in scene.objects)
        unique = [o for o in scene.objects if looks[(o.color, o.shape)] == 1]
        for k, obj in enumerate(unique):
            others = tuple(o for o in scene.objects if o.id != obj.id)
            facts += [AttributeFact(row, obj, attribute, others, scene.background) for attribute in attributes
                      if attribute not in SCENE_ATTRIBUTES or k == 0]
    return facts


def attribute_pair(fact: AttributeFact, rng: random.Random) -> tuple[str, str]:
    """The fact stated, and the same words with the attribute changed (false of the scene)."""
    obj, attribute = fact.subject, fact.attribute
    if attribute == "count":  # the scene's objects counted, none named
        return _count_pair(1 + len(fact.others), rng)
    color = lexicon.COLOR_WORDS[obj.color][0] if rng.random() < 0.8 else rng.choice(lexicon.COLOR_WORDS[obj.color])
    shape = rng.choice(lexicon.SHAPES[obj.shape])
    if attribute == "size":
        other = "small" if obj.size == "large" else "large"
        true, false = (f"{rng.choice(lexicon.SIZE_WORDS[s])} {color} {shape}" for s in (obj.size, other))
    elif attribute == "color":  # to a colour no other object of that shape has, so the twin is false
        other, _ = absent_kind((obj, *fact.others), rng, shape=obj.shape)
        true, false = (f"{rng.choice(lexicon.COLOR_WORDS[c])} {shape}" for c in (obj.color, other))
    elif attribute == "texture":
        other = rng.choice([t for t in lexicon.TEXTURES if t != obj.texture])
        true, false = (f"{color} {rng.choice(lexicon.TEXTURE_WORDS[t])} {shape}" for t in (obj.texture, other))
    elif attribute == "place":
        other = rng.choice([p for p in lexicon.PLACES.values() if p != obj.place])
        true, false = (f"{color} {shape} {place_phrase(p)}" for p in (obj.place, other))
    elif attribute == "background":  # the scene's, stated after the object
        other = rng.choice([b for b in lexicon.BACKGROUNDS if b != fact.background])
        true, false = (f"{color} {shape} on {article(b)} {b} background" for b in (fact.background, other))
    else:
        raise ValueError(f"unknown attribute {attribute!r} (known: {', '.join(ATTRIBUTES)})")
    lead = rng.choice(LEADS)
    closing = ""
    if fact.others and lead and rng.random() < 0.5:
        closing = " and " + ", ".join(_named(o, rng) for o in fact.others)
    return (f"{lead}{article(true)} {true}{closing}", f"{lead}{article(false)} {false}{closing}")


def _count_pair(count: int, rng: random.Random) -> tuple[str, str]:
    other = rng.choice([n for n in lexicon.NUMBER_WORDS if n != count])
    noun, lead = rng.choice(("shape", "object")), rng.choice(COUNT_LEADS)
    if lead == "there are " and 1 in (count, other):
        lead = ""  # "there are one shape" is not a sentence the captions would make
    true, false = (f"{lexicon.NUMBER_WORDS[n]} {noun}{'s' if n > 1 else ''}" for n in (count, other))
    return f"{lead}{true}", f"{lead}{false}"


def _named(obj: WorldObject, rng: random.Random) -> str:
    words = f"{lexicon.COLOR_WORDS[obj.color][0]} {rng.choice(lexicon.SHAPES[obj.shape])}"
    return f"{article(words)} {words}"
