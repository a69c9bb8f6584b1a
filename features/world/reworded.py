"""Foils in wordings the world never writes: how much of a reward model's reading is the templates'.

The world's captions (features/world/captions.py), its rendered foils (foils.py) and the recipes'
statements all name objects in a few fixed frames, the subject first ("a red circle above a blue
star"). A text tower can then pass every foil those frames make by word order alone. These foils say
the same facts in other frames, each true caption and its foil differing in one fact:

  shape, color        "in this picture we can see a red circle" / "... a red star"
  color_predicate     "the circle in the picture is red" (one object of that shape in the scene)
  count               "three shapes in total"
  background          "a red circle in front of a gray background"
  relation_located    "the red circle is located above the blue star"
  relation_inverted   "above the blue star there is a red circle" (the subject last)
  relation_seen       "a red circle can be seen above the blue star"
  relation_has        "the blue star has a red circle above it" (the subject inside the object's phrase)

Relations are stated only where colours and shapes name them unambiguously (Scene.nameable_relations).
Exact by construction from scenes.json, deterministic by seed, in the meta-evaluation foil format; an
image gives one item per true caption, the image's references beside each.
"""

from __future__ import annotations

import random
from dataclasses import replace

from features.world import lexicon
from features.world.foils import object_phrase, relation_words
from features.world.scene import Scene, WorldObject

RELATION_FRAMES = {  # filled with the subject (a), the object (b) and the relation's words
    "relation_located": "{the_a} is located {rel} {the_b}",
    "relation_inverted": "{rel} {the_b} there is {a}",
    "relation_seen": "{a} can be seen {rel} {the_b}",
    "relation_has": "{the_b} has {a} {rel} it",
}
KINDS = ("shape", "color", "color_predicate", "count", "background", *RELATION_FRAMES)


def _we_see(obj: WorldObject) -> str:
    return f"in this picture we can see {object_phrase(obj)}"


def _state(frame: str, subject: WorldObject, relation: str, obj: WorldObject) -> str:
    return frame.format(a=object_phrase(subject), the_a=object_phrase(subject, definite=True),
                        the_b=object_phrase(obj, definite=True), rel=relation_words(relation))


def scene_reworded(scene: Scene, rng: random.Random) -> list[tuple[str, dict]]:
    """(true caption, foil) pairs of one scene, one per kind the scene allows."""
    objects = scene.objects
    obj = rng.choice(objects)
    looks = {(o.color, o.shape) for o in objects}
    other_shape = rng.choice([s for s in lexicon.SHAPES if (obj.color, s) not in looks])
    other_color = rng.choice([c for c in lexicon.COLORS if (c, obj.shape) not in looks])
    pairs = [(_we_see(obj), {"kind": "shape", "caption": _we_see(replace(obj, shape=other_shape))}),
             (_we_see(obj), {"kind": "color", "caption": _we_see(replace(obj, color=other_color))})]
    if sum(o.shape == obj.shape for o in objects) == 1:
        said = "the {} in the picture is {}"
        pairs.append((said.format(obj.shape, obj.color),
                      {"kind": "color_predicate", "caption": said.format(obj.shape, other_color)}))
    count = rng.choice([n for n in lexicon.NUMBER_WORDS if n != len(objects)])
    pairs.append((f"{lexicon.NUMBER_WORDS[len(objects)]} shapes in total",
                  {"kind": "count", "caption": f"{lexicon.NUMBER_WORDS[count]} shapes in total"}))
    background = rng.choice([b for b in lexicon.BACKGROUNDS if b != scene.background])
    front = f"{object_phrase(obj)} in front of a {{}} background"
    pairs.append((front.format(scene.background), {"kind": "background", "caption": front.format(background)}))
    if relations := scene.nameable_relations():
        a, relation, b = rng.choice(relations)
        pairs += [(_state(frame, a, relation, b),
                   {"kind": kind, "caption": _state(frame, a, lexicon.INVERSE[relation], b)})
                  for kind, frame in RELATION_FRAMES.items()]
    return pairs


def reworded_foils(scenes: dict[int, Scene], references: dict[int, list[str]], image_ids: list[int],
                   seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    items = []
    for image_id in image_ids:
        grouped: dict[str, list[dict]] = {}
        for caption, foil in scene_reworded(scenes[image_id], rng):
            grouped.setdefault(caption, []).append(foil)
        items += [{"image_id": image_id, "references": references.get(image_id, []), "caption": caption,
                   "foils": foils} for caption, foils in grouped.items()]
    return items
