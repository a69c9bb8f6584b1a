"""The text stage's attribute pairs (rewards/recipes/attribute_facts.py): every statement is checked
against its scene by the world parser, not by the writer, and look-alikes never give a fact."""

from __future__ import annotations

import random

from features.world import lexicon
from features.world.parse import contradictions, parse_caption
from features.world.scene import Scene, WorldObject
from rewards.recipes.attribute_facts import ATTRIBUTES, attribute_facts, attribute_pair
from rewards.recipes.data import Split
from rewards.recipes.text_stage import CaptionsDataset, roles, statement_pair


def test_each_statement_is_true_and_its_changed_twin_false_by_one_claim(world_train):
    train, scenes = world_train
    facts = attribute_facts(train, scenes, ATTRIBUTES)
    assert {f.attribute for f in facts} == set(ATTRIBUTES) and len(facts) > 60
    rng = random.Random(0)
    for fact in facts:
        scene = scenes[train.image_ids[fact.row]]
        for _ in range(3):  # several draws of the wording
            true, false = attribute_pair(fact, rng)
            assert contradictions(parse_caption(true), scene) == [], true
            assert len(contradictions(parse_caption(false), scene)) == 1, (true, false)


def test_objects_with_a_look_alike_give_no_fact():
    """Two red circles, one small, one large: "a large red circle" is true of the scene whichever is
    meant, so neither circle gives a fact; the star does, and its twin is false."""
    objects = [WorldObject(0, "circle", "red", "small", "solid", (10.0, 10.0), 6.0, "top left"),
               WorldObject(1, "circle", "red", "large", "striped", (54.0, 54.0), 10.0, "bottom right"),
               WorldObject(2, "star", "blue", "small", "solid", (32.0, 32.0), 6.0, "center")]
    scene = Scene(64, "gray", (128, 128, 128), objects, [])
    split = Split([7], ["unused.png"], [["a picture"]], [[]], [])
    facts = attribute_facts(split, {7: scene}, ATTRIBUTES)
    assert [f.subject.shape for f in facts] == ["star"] * len(ATTRIBUTES)
    for fact in facts:
        true, false = attribute_pair(fact, random.Random(1))
        assert not contradictions(parse_caption(true), scene) and contradictions(parse_caption(false), scene)


def test_attribute_pairs_state_no_relation_and_join_each_images_pairs(world_train):
    train, scenes = world_train
    facts = attribute_facts(train, scenes, ("size",))
    assert not roles(facts[0]).any()
    assert statement_pair(facts[0], random.Random(0), 1.0) == attribute_pair(facts[0], random.Random(0))
    plain = CaptionsDataset(train, train.pool("both"), scenes, [], 0, 1, ("shape",), 0.0)
    with_sizes = CaptionsDataset(train, train.pool("both"), scenes, facts, 0, 1, ("shape",), 0.0)
    row = facts[0].row
    assert plain[row].group == with_sizes[row].group  # the captions are drawn as without attributes
    assert len(with_sizes[row].pairs) == len(plain[row].pairs) + 1


def test_a_colour_twin_never_names_another_object_of_that_shape():
    """A green star beside a white star: "a white star" would be true of the scene, so the green
    star's colour twin takes any colour but those two, every draw."""
    objects = [WorldObject(0, "star", "green", "small", "striped", (10.0, 10.0), 6.0, "top left"),
               WorldObject(1, "star", "white", "large", "solid", (54.0, 54.0), 10.0, "bottom right")]
    scene = Scene(64, "gray", (128, 128, 128), objects, [])
    split = Split([7], ["unused.png"], [["a picture"]], [[]], [])
    fact = next(f for f in attribute_facts(split, {7: scene}, ("color",)) if f.subject.color == "green")
    rng = random.Random(0)
    for _ in range(50):
        true, false = attribute_pair(fact, rng)
        named = false.split(" and ")[0]  # the closing may list the other objects as they are
        assert "white" not in named and "green" not in named and named != true.split(" and ")[0], false
        assert len(contradictions(parse_caption(false), scene)) == 1, false


def test_a_count_is_stated_once_a_scene_in_words_that_agree(world_train):
    """The count names no object: one fact a scene, its number the scene's, its twin another number,
    and never "one shapes" or "there are one object"."""
    train, scenes = world_train
    facts = attribute_facts(train, scenes, ("count",))
    assert len({f.row for f in facts}) == len(facts) > 20
    rng = random.Random(0)
    for fact in facts:
        count = len(scenes[train.image_ids[fact.row]].objects)
        for _ in range(5):
            true, false = attribute_pair(fact, rng)
            assert true.split()[-2] == lexicon.NUMBER_WORDS[count] and false.split()[-2] != true.split()[-2]
            for text in (true, false):
                number, noun = text.split()[-2:]
                assert noun.endswith("s") == (number != "one"), text
                assert not text.startswith("there are one"), text
