"""Sampling one scene of the offline world: objects, places and the relations between them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from features.world import lexicon
from plumbing.errors import DataError

MAX_PLACEMENT_TRIES = 200
RELATION_MARGIN = 0.06  # centres must differ by this share of the side for a relation to hold


@dataclass
class WorldObject:
    id: int
    shape: str
    color: str
    size: str
    texture: str
    center: tuple[float, float]  # pixels, (x, y) with y downwards
    radius: float  # pixels
    place: str  # 3x3 grid cell name, e.g. "top left"
    bbox: tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclass
class Scene:
    image_size: int
    background: str
    background_rgb: tuple[int, int, int]
    objects: list[WorldObject]
    relations: list[dict] = field(default_factory=list)  # {"subject", "relation", "object"} ids

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: dict) -> Scene:
        objects = [WorldObject(**{**o, "center": tuple(o["center"]), "bbox": tuple(o["bbox"])})
                   for o in data["objects"]]
        return Scene(data["image_size"], data["background"], tuple(data["background_rgb"]),
                     objects, list(data.get("relations", [])))

    def holds(self, subject: int, relation: str, obj: int) -> bool:
        return {"subject": subject, "relation": relation, "object": obj} in self.relations

    def nameable_relations(self) -> list[tuple[WorldObject, str, WorldObject]]:
        """(subject, relation, object) of every relation a statement naming colours and shapes states
        unambiguously, in the order scenes.json records them: its two objects look different, and no
        other two objects that look like them hold the inverse (else the inverse statement would be
        true of those)."""
        objects = {obj.id: obj for obj in self.objects}
        stated = [(objects[f["subject"]], f["relation"], objects[f["object"]]) for f in self.relations]
        held = {(a.color, a.shape, relation, b.color, b.shape) for a, relation, b in stated}
        return [(a, relation, b) for a, relation, b in stated
                if (a.color, a.shape) != (b.color, b.shape)
                and (a.color, a.shape, lexicon.INVERSE[relation], b.color, b.shape) not in held]


def place_name(x: float, y: float, size: int) -> str:
    col = min(int(3 * x / size), 2)
    row = min(int(3 * y / size), 2)
    return lexicon.PLACES[(row, col)]


def relations_between(a: WorldObject, b: WorldObject, size: int) -> list[str]:
    """Every relation that holds of a with respect to b (possibly two: left of and above)."""
    margin = RELATION_MARGIN * size
    dx = b.center[0] - a.center[0]
    dy = b.center[1] - a.center[1]
    found = []
    if dx > margin:
        found.append("left of")
    if dx < -margin:
        found.append("right of")
    if dy > margin:
        found.append("above")
    if dy < -margin:
        found.append("below")
    return found


def dominant_relation(a: WorldObject, b: WorldObject) -> str:
    """The single relation a caption states: the axis along which the two differ most."""
    dx = b.center[0] - a.center[0]
    dy = b.center[1] - a.center[1]
    if abs(dx) >= abs(dy):
        return "left of" if dx > 0 else "right of"
    return "above" if dy > 0 else "below"


def sample_scene(rng: np.random.Generator, image_size: int, max_objects: int = 4) -> Scene:
    background = str(rng.choice(list(lexicon.BACKGROUNDS)))
    base = np.array(lexicon.BACKGROUNDS[background])
    background_rgb = tuple(int(v) for v in np.clip(base + rng.integers(-12, 13, size=3), 0, 255))
    while True:
        objects = _sample_objects(rng, image_size, int(rng.integers(1, max_objects + 1)))
        if objects is not None:
            break
    relations = [
        {"subject": a.id, "relation": rel, "object": b.id}
        for a in objects for b in objects if a.id != b.id
        for rel in relations_between(a, b, image_size)
    ]
    return Scene(image_size, background, background_rgb, objects, relations)


def _sample_objects(rng: np.random.Generator, image_size: int, count: int) -> list[WorldObject] | None:
    used: set[tuple[str, str]] = set()
    objects: list[WorldObject] = []
    for index in range(count):
        shape, color = _distinct_kind(rng, used)
        size = str(rng.choice(list(lexicon.SIZES)))
        radius = lexicon.SIZES[size] * image_size / 2
        center = _free_spot(rng, image_size, radius, objects)
        if center is None:
            return None
        x, y = center
        bbox = (int(x - radius), int(y - radius), int(np.ceil(x + radius)), int(np.ceil(y + radius)))
        objects.append(WorldObject(
            id=index, shape=shape, color=color, size=size,
            texture=str(rng.choice(lexicon.TEXTURES)), center=(round(x, 2), round(y, 2)),
            radius=round(radius, 2), place=place_name(x, y, image_size), bbox=bbox,
        ))
    return objects


def _distinct_kind(rng: np.random.Generator, used: set[tuple[str, str]]) -> tuple[str, str]:
    # No two objects share colour and shape, so every caption phrase names one object.
    while True:
        kind = (str(rng.choice(list(lexicon.SHAPES))), str(rng.choice(list(lexicon.COLORS))))
        if kind not in used:
            used.add(kind)
            return kind


def _free_spot(rng: np.random.Generator, image_size: int, radius: float,
               others: list[WorldObject]) -> tuple[float, float] | None:
    border = radius + 1.5
    gap = 0.04 * image_size
    for _ in range(MAX_PLACEMENT_TRIES):
        x, y = rng.uniform(border, image_size - border, size=2)
        if all(np.hypot(x - o.center[0], y - o.center[1]) > radius + o.radius + gap for o in others):
            return float(x), float(y)
    return None


_VOCABULARY = {"shape": lexicon.SHAPES, "color": lexicon.COLORS, "size": lexicon.SIZES,
               "texture": lexicon.TEXTURES, "place": tuple(lexicon.PLACES.values())}


def _checked(scene: Scene) -> Scene:
    """A scene whose words the world's parser and negative builder know: another shape or colour
    would make a "negative" whose truth nothing can check."""
    if scene.background not in lexicon.BACKGROUNDS:
        raise ValueError(f"background {scene.background!r} is not one of {sorted(lexicon.BACKGROUNDS)}")
    for obj in scene.objects:
        for field_name, known in _VOCABULARY.items():
            if getattr(obj, field_name) not in known:
                raise ValueError(f"object {obj.id}: {field_name} {getattr(obj, field_name)!r} is not one of "
                                 f"{sorted(known)}")
    ids = {obj.id for obj in scene.objects}
    for relation in scene.relations:
        if not isinstance(relation, dict) or relation.get("relation") not in lexicon.RELATIONS \
                or not {relation.get("subject"), relation.get("object")} <= ids:
            raise ValueError(f"relation {relation!r} names an unknown relation or object")
    return scene


def load_scenes(path: str | Path) -> dict[int, Scene]:
    return load_world_scenes(path)[0]


def load_world_scenes(path: str | Path) -> tuple[dict[int, Scene], int | None]:
    """The scene graphs of a scenes.json by image id, and the generator seed it records (None when
    it records none), from one read of the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        images = data["images"]
        if not isinstance(images, dict):
            raise TypeError(f"'images' must map image ids to scenes, got {type(images).__name__}")
    except FileNotFoundError:
        raise DataError(f"{path}: scenes file not found") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: not a world scenes.json: {exc}") from None
    scenes = {}
    for key, value in images.items():
        try:
            scenes[int(key)] = _checked(Scene.from_json(value))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{path}: image id {key}: not a world scene: {exc}") from None
    seed = data.get("seed")
    return scenes, seed if isinstance(seed, int) else None
