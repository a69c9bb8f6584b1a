from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from features.world import generate as world_cli
from features.world import lexicon
from features.world.generate import WorldConfig, generate
from features.world.parse import attribute_errors, contradictions, match_object, parse_caption
from features.world.scene import Scene, WorldObject, dominant_relation, load_scenes, place_name, relations_between
from plumbing.errors import DataError


def load_world(root):
    dataset = json.loads((root / "dataset.json").read_text())
    scenes = json.loads((root / "scenes.json").read_text())["images"]
    return dataset["images"], {int(k): Scene.from_json(v) for k, v in scenes.items()}


def digest_tree(root):
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix != ".yaml":
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def test_world_is_deterministic_for_a_seed(tmp_path):
    a = generate(WorldConfig(out=str(tmp_path / "a"), train=10, val=3, test=3, seed=5, workers=1), progress=False)
    b = generate(WorldConfig(out=str(tmp_path / "b"), train=10, val=3, test=3, seed=5, workers=2), progress=False)
    c = generate(WorldConfig(out=str(tmp_path / "c"), train=10, val=3, test=3, seed=6, workers=1), progress=False)
    assert digest_tree(a) == digest_tree(b)  # also independent of the number of workers
    assert digest_tree(a) != digest_tree(c)


def test_captions_agree_with_the_scene_graph(tiny_world):
    images, scenes = load_world(tiny_world)
    for image in images:
        scene = scenes[image["imgid"]]
        captions = [s["raw"] for s in image["sentences"]] + [image["long_captions"][0]["raw"]]
        covered = set()
        for text in captions:
            claims = parse_caption(text)
            assert claims.mentions, text
            named = []
            for mention in claims.mentions:
                obj = match_object(mention, scene)
                assert obj is not None, f"{text!r} mentions a {mention.color} {mention.shape} not in the scene"
                assert mention.color == obj.color, text
                assert attribute_errors(mention, obj) == [], text
                named.append(obj.id)
                covered.add(obj.id)
            for subj, relation, obj in claims.relations:
                assert scene.holds(named[subj], relation, named[obj]), f"{text!r}: relation {relation} is false"
            if claims.count is not None:
                assert claims.count == len(scene.objects), text
            if claims.background is not None:
                assert claims.background == scene.background, text
        assert covered == {o.id for o in scene.objects}
        long_claims = parse_caption(image["long_captions"][0]["raw"])
        first_mentions = {}
        for m in long_claims.mentions:
            first_mentions.setdefault((m.color, m.shape), m)
        assert {(m.color, m.shape, m.size, m.texture) for m in first_mentions.values()} == {
            (o.color, o.shape, o.size, o.texture) for o in scene.objects}
        assert long_claims.count == len(scene.objects)
        assert len(long_claims.relations) == len(scene.objects) - 1


def test_pixels_show_the_recorded_objects(tiny_world):
    """Each solid object's centre has its recorded colour: images and scenes.json agree."""
    images, scenes = load_world(tiny_world)
    names, rgbs = list(lexicon.COLORS), np.array(list(lexicon.COLORS.values()), dtype=float)
    checked = 0
    for image in images:
        pixels = np.asarray(Image.open(tiny_world / image["filepath"] / image["filename"]), dtype=float)
        for obj in scenes[image["imgid"]].objects:
            if obj.texture != "solid" or obj.shape in ("star", "cross"):
                continue
            x, y = round(obj.center[0]), round(obj.center[1])
            mean = pixels[y - 1:y + 2, x - 1:x + 2].reshape(-1, 3).mean(axis=0)
            assert names[int(np.argmin(((rgbs - mean) ** 2).sum(axis=1)))] == obj.color
            checked += 1
    assert checked > 5


def test_world_is_rich_enough(tmp_path):
    import open_clip

    root = generate(WorldConfig(out=str(tmp_path / "w"), train=300, val=0, test=0, seed=1, workers=2), progress=False)
    images, scenes = load_world(root)
    objects = [o for s in scenes.values() for o in s.objects]
    assert {o.shape for o in objects} == set(lexicon.SHAPES) and len(lexicon.SHAPES) >= 6
    assert {o.color for o in objects} == set(lexicon.COLORS) and len(lexicon.COLORS) >= 8
    assert {o.size for o in objects} == {"small", "large"}
    assert {o.texture for o in objects} == set(lexicon.TEXTURES)
    assert Counter(len(s.objects) for s in scenes.values()).keys() == {1, 2, 3, 4}
    assert len({s.background for s in scenes.values()}) >= 4
    assert min(2 * o.radius for o in objects) >= 10  # small objects stay recognisable at 64 px
    for s in scenes.values():  # non-overlapping
        for a in s.objects:
            for b in s.objects:
                if a.id < b.id:
                    assert np.hypot(a.center[0] - b.center[0], a.center[1] - b.center[1]) > a.radius + b.radius
    distinct = np.mean([len({s["raw"] for s in im["sentences"]}) for im in images])
    assert distinct >= 4.0  # paraphrase variety across the 5 references
    tokenizer = open_clip.tokenizer.SimpleTokenizer()
    lengths = [len(tokenizer.encode(im["long_captions"][0]["raw"])) + 2 for im in images]  # + SOT/EOT
    assert np.mean([n > 77 for n in lengths]) >= 0.3
    for im in images:
        units = im["long_captions"][0]["detail_units"]
        assert " ".join(units) == im["long_captions"][0]["raw"] and len(units) >= 5


def test_cli_skips_a_finished_world_and_rejects_bad_config(tmp_path, capsys):
    args = ["--out", str(tmp_path / "w"), "--train", "3", "--val", "1", "--test", "1", "--workers", "1"]
    assert world_cli.main(args) == 0
    assert world_cli.main(args) == 0
    assert "already complete" in capsys.readouterr().out
    assert world_cli.main([*args, "--set", "image_sise=32"]) == 2
    assert "unknown config key 'image_sise'" in capsys.readouterr().err
    assert world_cli.main([*args, "--image-size", "16"]) == 2


@pytest.mark.parametrize("text,expected", [
    ("a big red striped circle left of a small blue square", [("red", "circle", "large", "striped"),
                                                              ("blue", "square", "small", None)]),
    ("two green crosses", [("green", "cross", None, None)]),
])
def test_parser_reads_free_text(text, expected):
    claims = parse_caption(text)
    assert [(m.color, m.shape, m.size, m.texture) for m in claims.mentions] == expected


@pytest.mark.parametrize("text,relations,places", [
    ("a red circle on the left of a blue square", [(0, "left of", 1)], []),  # against the square, not the image
    ("a red star on the left of the image", [], [(0, "left")]),
    ("a red star in the top right corner of the picture", [], [(0, "top right")]),
    ("a red star on the right", [], [(0, "right")]),
])
def test_parser_tells_a_place_in_the_image_from_one_against_an_object(text, relations, places):
    claims = parse_caption(text)
    assert claims.relations == relations and [(m, p) for m, p, _, _ in claims.places] == places


def _two_hexagons() -> Scene:
    """A large black hexagon at the top left, a small yellow one at the bottom right, a star between."""
    def obj(i, shape, color, size, texture, x, y):
        return WorldObject(i, shape, color, size, texture, (x, y), 10.0, place_name(x, y, 64))
    objects = [obj(0, "hexagon", "black", "large", "solid", 10.0, 10.0),
               obj(1, "hexagon", "yellow", "small", "striped", 54.0, 54.0),
               obj(2, "star", "red", "small", "solid", 32.0, 32.0)]
    relations = [{"subject": a.id, "relation": r, "object": b.id} for a in objects for b in objects
                 if a.id != b.id for r in relations_between(a, b, 64)]
    return Scene(64, "gray", (128, 128, 128), objects, relations)


@pytest.mark.parametrize("text,false_claims", [
    ("a small hexagon", []),  # the yellow one; the black one is large
    ("a large hexagon and a small hexagon", []),
    ("a small striped hexagon", []),
    ("a small solid hexagon", ["size of the black hexagon"]),  # no hexagon is both: one error either way
    ("a large striped hexagon", ["texture of the black hexagon"]),  # the yellow one would be two
    ("a hexagon above the star", []),  # the black one is
    ("a small hexagon above the star", ["the yellow hexagon is not above the red star"]),
    ("a hexagon in the bottom right corner", []),
    ("a large hexagon in the bottom right corner", ["the black hexagon is not at bottom right"]),
])
def test_parser_reads_a_mention_as_any_object_its_words_fit(text, false_claims):
    """Two objects of one shape: a mention without its colour names whichever one its other words fit,
    and a claim about it is false only if it is false of every object it may name."""
    assert contradictions(parse_caption(text), _two_hexagons()) == false_claims


_PLACE_WORDINGS = {"top left": "in the top left corner of the image", "top": "at the top of the picture",
                   "top right": "in the top right corner", "left": "on the left side", "center": "in the center",
                   "right": "on the right of the image", "bottom left": "in the bottom left corner",
                   "bottom": "at the bottom", "bottom right": "in the bottom right corner"}


def _paraphrase(obj, rng, article: str = "a") -> str:
    """An object in words the world's captions do not use in this order, with or without its colour."""
    size, color = rng.choice(lexicon.SIZE_WORDS[obj.size]), rng.choice(lexicon.COLOR_WORDS[obj.color])
    shape, texture = rng.choice(lexicon.SHAPES[obj.shape]), rng.choice(lexicon.TEXTURE_WORDS[obj.texture])
    form = rng.choice([f"{size} {color} {shape}", f"{size} {texture} {color} {shape}",
                       f"{color} {shape} with a {texture} pattern", f"{size} {shape}", shape])
    return f"{article} {form}"


def test_parser_never_calls_a_true_caption_in_other_wording_false(tiny_world):
    """True statements about each scene in wordings of our own (colourless mentions among objects of
    one shape, "on the left of", places "of the image"): the parser finds no contradiction."""
    rng = random.Random(0)
    scenes = load_scenes(tiny_world / "scenes.json")
    checked = 0
    for scene in scenes.values():
        for _ in range(10):
            obj = rng.choice(scene.objects)
            texts = [f"there is {_paraphrase(obj, rng)} {_PLACE_WORDINGS[obj.place]}"]
            if len(scene.objects) > 1:
                a, b = rng.sample(scene.objects, 2)
                relation = dominant_relation(a, b)
                phrase = {"left of": "on the left of", "right of": "on the right of"}.get(
                    relation, rng.choice(lexicon.RELATION_PHRASES[relation]))
                texts.append(f"{_paraphrase(a, rng)} is {phrase} {_paraphrase(b, rng, 'the')} on a "
                             f"{scene.background} background")
            for text in texts:
                assert contradictions(parse_caption(text), scene) == [], (text, scene.objects)
                checked += 1
    assert checked > 800


@pytest.mark.parametrize(("change", "needle"), [
    (lambda scene: scene["objects"][0].update(shape="blob"), "object 0: shape 'blob' is not one of"),
    (lambda scene: scene["objects"][0].update(texture="furry"), "texture 'furry'"),
    (lambda scene: scene["objects"][0].pop("color"), "'color'"),
    (lambda scene: scene.update(background="plaid"), "background 'plaid'"),
    (lambda scene: scene.update(objects="none"), "not a world scene"),
    (lambda scene: scene.update(relations=[{"subject": 0, "relation": "inside", "object": 0}]), "unknown relation"),
])
def test_a_scene_the_world_cannot_read_is_named_by_image_id(tiny_world, tmp_path, change, needle):
    """scenes.json decides what a hard negative may say: a word outside the world's lexicon would
    make negatives nothing can check, so it is an error naming the image, not a silent pass."""
    data = json.loads((tiny_world / "scenes.json").read_text())
    key = sorted(data["images"], key=int)[1]
    change(data["images"][key])
    path = tmp_path / "scenes.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=re.escape(f"{path}: image id {key}: ")) as caught:
        load_scenes(path)
    assert needle in str(caught.value)
