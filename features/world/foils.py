"""Foil captions on the offline world, exact by construction (scenes.json is the ground truth).

For each image a correct caption is rendered from its scene — short ("a red circle to the left of
a blue square ...") and long (one sentence per object with size, color, texture, place, and the
relation to the object before it). Each foil changes one fact before rendering:

  shape     one object's shape becomes a shape no object in the scene has;
  color     one object's color becomes a color no object in the scene has;
  added     a sentence about an object that is not in the scene is appended;
  relation  one stated spatial relation is swapped for its inverse.

`reference_foils` builds foils in the dataset's own wording instead: each image's first reference and
first long caption, with one negative of every kind the hard-negative builder can make of it (size,
texture, binding, place, count and background as well as the four above; each checked false against
the scene by the world parser). Those kinds and that wording are what the rendered foils leave out.

Deterministic by seed. Written in the meta-evaluation foil format (rewards/meta_eval.py).
"""

from __future__ import annotations

import random
from dataclasses import replace

from features.world import lexicon
from features.world.captions import article, place_phrase, reading_order
from features.world.negatives import KINDS as NEGATIVE_KINDS
from features.world.negatives import hard_negatives
from features.world.scene import Scene, WorldObject, dominant_relation

FOIL_KINDS = ("shape", "color", "added", "relation")


def object_phrase(obj: WorldObject, size: bool = False, definite: bool = False) -> str:
    """The words naming an object: "a red circle" (`size`: "a large red circle"; `definite`: "the ...")."""
    words = ([obj.size] if size else []) + [obj.color, obj.shape]
    det = "the" if definite else article(words[0])
    return " ".join([det, *words])


def relation_words(relation: str) -> str:
    return lexicon.RELATION_PHRASES[relation][0]  # "to the left of", "above", ...


def render_short(objects: list[WorldObject], relation: str | None) -> str:
    head = object_phrase(objects[0])
    if len(objects) == 1:
        return f"{head} {place_phrase(objects[0].place)}"
    text = f"{head} {relation_words(relation)} {object_phrase(objects[1])}"
    rest = [object_phrase(o) for o in objects[2:]]
    return text + ("".join(f", {r}" for r in rest[:-1]) + f" and {rest[-1]}" if rest else "")


def render_long(objects: list[WorldObject], relations: list[str | None], background: str,
                extra: WorldObject | None = None) -> str:
    count = lexicon.NUMBER_WORDS[len(objects)]
    noun = "shape" if len(objects) == 1 else "shapes"
    sentences = [f"The image shows {count} {noun} on {article(background)} {background} background."]
    for k, obj in enumerate(objects):
        texture = "a solid fill" if obj.texture == "solid" else f"a {obj.texture} pattern"
        named = object_phrase(obj, size=True).capitalize()
        sentences.append(f"{named} with {texture} appears {place_phrase(obj.place)} of the image.")
        if k > 0 and relations[k]:
            before = object_phrase(objects[k - 1], size=True, definite=True)
            sentences.append(f"It is {relation_words(relations[k])} {before}.")
    if extra is not None:
        sentences.append(f"There is also {object_phrase(extra, size=True)} {place_phrase(extra.place)} of the image.")
    return " ".join(sentences)


def _absent(values: list[str], present: set[str], rng: random.Random) -> str:
    return rng.choice(sorted(set(values) - present))


def stated_relations(objects: list[WorldObject]) -> tuple[str | None, list[str | None]]:
    """The relations the rendered captions of objects (in reading order) state: the short caption's
    (the first object to the second), and the long caption's, one per object (to the one before it;
    None for the first)."""
    relations: list[str | None] = [None] + [dominant_relation(objects[k], objects[k - 1])
                                            for k in range(1, len(objects))]
    first = dominant_relation(objects[0], objects[1]) if len(objects) > 1 else None
    return first, relations


def scene_foils(scene: Scene, rng: random.Random) -> dict:
    """{"caption", "long_caption", "foils": [{"kind", "caption", "long_caption"}]} for one scene."""
    objects = reading_order(scene)
    first_relation, relations = stated_relations(objects)
    shapes = {o.shape for o in objects}
    colors = {o.color for o in objects}
    target = rng.randrange(len(objects))

    def variant(objs: list[WorldObject], rels: list[str | None], first: str | None, extra=None) -> dict:
        return {"caption": render_short(objs, first) + (f" and {object_phrase(extra)}" if extra else ""),
                "long_caption": render_long(objs, rels, scene.background, extra)}

    def with_object(new: WorldObject) -> list[WorldObject]:
        return [new if k == target else o for k, o in enumerate(objects)]

    foils = [
        {"kind": "shape", **variant(with_object(replace(objects[target], shape=_absent(
            list(lexicon.SHAPES), shapes, rng))), relations, first_relation)},
        {"kind": "color", **variant(with_object(replace(objects[target], color=_absent(
            list(lexicon.COLORS), colors, rng))), relations, first_relation)},
        {"kind": "added", **variant(objects, relations, first_relation, extra=replace(
            objects[target], shape=_absent(list(lexicon.SHAPES), shapes, rng),
            color=_absent(list(lexicon.COLORS), colors, rng), place=rng.choice(sorted(set(lexicon.PLACES.values())))))},
    ]
    if first_relation is not None:
        swapped = [None] + [lexicon.INVERSE[r] for r in relations[1:]]
        foils.append({"kind": "relation", **variant(objects, swapped, lexicon.INVERSE[first_relation])})
    return {**variant(objects, relations, first_relation), "foils": foils}


def world_foils(scenes: dict[int, Scene], references: dict[int, list[str]], image_ids: list[int],
                seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    items = []
    for image_id in image_ids:
        item = scene_foils(scenes[image_id], rng)
        items.append({"image_id": image_id, "references": references.get(image_id, []), **item})
    return items


def reference_foils(scenes: dict[int, Scene], captions: dict[int, tuple[list[str], list[str]]],
                    image_ids: list[int], seed: int = 0) -> list[dict]:
    """Foil items from each image's own (short references, long captions): its first reference as
    "caption", its first long caption as "long_caption" (when it has one), and per kind one foil with
    the field(s) the builder could change. "references" are the image's other references (all of them
    when every one says the same), so a reference-based metric does not find the caption among its own
    references. Images with no foil of any kind are left out."""
    rng = random.Random(seed)
    items = []
    for image_id in image_ids:
        shorts, longs = captions[image_id]
        texts = {"caption": shorts[0]} | ({"long_caption": longs[0]} if longs else {})
        foils: dict[str, dict] = {}
        for field, text in texts.items():
            for negative in hard_negatives(text, scenes[image_id], rng, len(NEGATIVE_KINDS)):
                foils.setdefault(negative.kind, {"kind": negative.kind})[field] = negative.text
        if foils:
            items.append({"image_id": image_id, "references": [r for r in shorts if r != shorts[0]] or shorts, **texts,
                          "foils": [foils[kind] for kind in NEGATIVE_KINDS if kind in foils]})
    return items
