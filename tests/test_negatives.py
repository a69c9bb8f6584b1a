"""World hard negatives: one fact changed, and never a caption the scene makes true."""

from __future__ import annotations

import difflib
import json
import random
from collections import Counter

from features.world import negatives as negatives_module
from features.world.negatives import KINDS, hard_negatives
from features.world.parse import contradictions, parse_caption
from features.world.scene import load_scenes


def _captions(world):
    images = json.loads((world / "dataset.json").read_text())["images"]
    scenes = load_scenes(world / "scenes.json")
    for image in images:
        scene = scenes[image["imgid"]]
        for text in [s["raw"] for s in image["sentences"]] + [c["raw"] for c in image["long_captions"]]:
            yield text, scene


def test_no_negative_is_true_of_its_scene(tiny_world):
    rng = random.Random(0)
    kinds = Counter()
    for text, scene in _captions(tiny_world):
        assert contradictions(parse_caption(text), scene) == [], text  # the references are true
        for negative in hard_negatives(text, scene, rng, count=len(KINDS)):
            assert negative.text != text
            assert contradictions(parse_caption(negative.text), scene), (text, negative.text)
            kinds[negative.kind] += 1
    assert set(kinds) == set(KINDS), kinds


def test_the_edits_themselves_are_false_not_just_filtered(tiny_world):
    """Each edit is built to be false: before the parser's check, at least 98% already are."""
    rng = random.Random(1)
    tried = false = 0
    for text, scene in _captions(tiny_world):
        words = negatives_module._Words(text)
        claims = negatives_module.parse_tokens(words.tokens)
        for build in negatives_module._BUILDERS.values():
            edited = build(words, claims, scene, rng)
            if edited is None:
                continue
            tried += 1
            false += bool(contradictions(parse_caption(edited), scene))
    assert tried > 500 and false / tried >= 0.98, (false, tried)


def test_a_negative_changes_one_fact_and_keeps_the_wording(tiny_world):
    rng = random.Random(2)
    for text, scene in list(_captions(tiny_world))[:150]:
        for negative in hard_negatives(text, scene, rng, count=3):
            before, after = text.split(), negative.text.split()
            if negative.kind == "added":
                assert after[: len(before)] == before
            else:
                if len(before) == len(after):
                    changed = sum(a != b for a, b in zip(before, after, strict=True))
                else:
                    edits = difflib.SequenceMatcher(None, before, after).get_opcodes()
                    changed = sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in edits if op != "equal")
                assert changed <= 6, (text, negative.text)
            assert negative.text[0].isupper() == text[0].isupper()  # casing kept: no shortcut for the model


def test_a_caption_already_false_gets_negatives_false_in_a_new_way(tiny_world):
    """A model caption may be false already (here: an object put in a corner it is not in): each of its
    negatives must add a contradiction of its own, so an edit that changes nothing true is no negative."""
    rng = random.Random(3)
    checked = 0
    for _, scene in list(_captions(tiny_world))[:60]:
        obj = scene.objects[0]
        wrong_place = next(p for p in ("top left", "bottom right") if p != obj.place)
        text = f"a {obj.size} {obj.color} {obj.shape} in the {wrong_place} corner"
        already = contradictions(parse_caption(text), scene)
        assert already, text
        for negative in hard_negatives(text, scene, rng, count=len(KINDS)):
            new = [claim for claim in contradictions(parse_caption(negative.text), scene) if claim not in already]
            assert new and negative.why == new, (text, negative.text)
            checked += 1
    assert checked > 60
