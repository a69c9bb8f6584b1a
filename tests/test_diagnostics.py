from __future__ import annotations

import json

import pytest

from features.world.scene import load_scenes
from rewards import MetricSuite, ScoringContext
from rewards.diagnostics.grounding import grounding
from rewards.diagnostics.text import text_diagnostics


def test_text_diagnostics_by_hand():
    corpus, items = text_diagnostics(["a dog on a", "a red circle and a red circle", ""])
    assert items["mean_length"] == [4.0, 7.0, 0.0]
    assert items["bad_ending"] == [1.0, 0.0, 0.0]
    # "a red circle and a red circle": bigrams a-red, red-circle, circle-and, and-a, a-red, red-circle
    assert items["repeat_2"][1] == pytest.approx(2 / 6)
    assert corpus["vocab_used"] == 6  # a dog on red circle and
    assert corpus["distinct_1"] == pytest.approx(6 / 11)


def test_grounding_against_the_scene_graph(tiny_world):
    scenes = load_scenes(tiny_world / "scenes.json")
    image_id, scene = next((i, s) for i, s in scenes.items() if len(s.objects) >= 2)
    first, second = scene.objects[0], scene.objects[1]
    absent_color = next(c for c in ("red", "green", "blue", "yellow", "purple", "orange", "white", "black")
                        if (c, first.shape) not in {(o.color, o.shape) for o in scene.objects})
    wrong_size = "small" if first.size == "large" else "large"
    captions = [
        f"a {first.color} {first.shape} and a {second.color} {second.shape}",  # all right, recall 2/n
        f"a {absent_color} {first.shape}",  # hallucinated
        f"a {wrong_size} {first.color} {first.shape}",  # attribute error
    ]
    corpus, items = grounding([image_id] * 3, captions, scenes)
    n = len(scene.objects)
    assert items["object_recall"] == [pytest.approx(2 / n), 0.0, pytest.approx(1 / n)]
    assert items["hallucination_caption"] == [0.0, 1.0, 0.0]
    assert corpus["hallucination_mention"] == pytest.approx(1 / 4)
    assert corpus["attribute_error"] == pytest.approx(1 / 3)


def test_suite_grounding_on_world_references(tiny_world):
    data = json.loads((tiny_world / "dataset.json").read_text())["images"]
    preds = {im["imgid"]: im["long_captions"][0]["raw"] for im in data}
    refs = {im["imgid"]: [s["raw"] for s in im["sentences"]] for im in data}
    out = MetricSuite("all", ScoringContext(scenes=str(tiny_world / "scenes.json"))).score(preds, refs)
    assert out.corpus["object_recall"] == 1.0 and out.corpus["hallucination_mention"] == 0.0
    assert out.corpus["attribute_error"] == 0.0
