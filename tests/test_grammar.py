"""The grammar reward and metric: a copy of the `clip` model's text tower fine-tuned with a head to tell
clean captions from corrupted ones; mixed in the bank from a config, scored as a metric, refused with
the recipe named when no grammar model is configured or when it was trained from another CLIP."""

from __future__ import annotations

import json
import random

import pytest

from features.clip_models.spec import RewardModelSpec
from plumbing.errors import ConfigError, DataError
from rewards import MetricSuite, RewardBank, ScoringContext
from rewards import train_grammar as grammar_cli
from rewards.text.corrupt import CORRUPTIONS, corrupt
from tests.clip_fixtures import TINY_ARCH, save_open_clip


@pytest.fixture(scope="module")
def trained(tiny_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("grammar")
    clip = save_open_clip(root / "clip.safetensors", seed=3)
    head = root / "grammar.safetensors"
    assert grammar_cli.main(["--arch", TINY_ARCH, "--weights", str(clip), "--dataset", str(tiny_world / "dataset.json"),
                             "--out", str(head), "--epochs", "2", "--device", "cpu"]) == 0
    return clip, head


def context(clip, head=None) -> ScoringContext:
    return ScoringContext(reward_models={"clip": RewardModelSpec(arch=TINY_ARCH, weights=str(clip),
                                                                 grammar=str(head) if head else None)},
                          device="cpu")


def test_corruptions_differ_from_the_caption_and_leave_one_word_alone():
    rng = random.Random(0)
    seen = set()
    for caption in ["a red circle above a blue star", "two dogs play on the grass", "a cat"]:
        for _ in range(20):
            kind, text = corrupt(caption, rng, ["tree", "of"])
            assert text != caption and kind in CORRUPTIONS
            seen.add(kind)
    assert seen == set(CORRUPTIONS) and corrupt("dog", rng, ["tree"]) is None


def test_the_grammar_model_trains_and_reports_held_out_accuracy(trained):
    _, head = trained
    summary = json.loads(head.with_suffix(".json").read_text())
    assert {"val_accuracy", "val_clean", "val_shuffle"} <= set(summary["val"])
    assert summary["val_items"]["clean"] == 12  # the tiny world's val images, one caption each


def test_grammar_mixes_in_the_bank_and_scores_as_a_metric(trained):
    clip, head = trained
    ctx = context(clip, head)
    bank = RewardBank.from_config({"grammar": 0.5, "length": 0.5}, ctx)
    out = bank(["a red circle", "circle circle red a"], [0, 1])
    assert out.values["grammar"].shape == (2,) and ((out.values["grammar"] >= 0) & (out.values["grammar"] <= 1)).all()
    with MetricSuite(["grammar", "mean_length"], ctx, False) as suite:
        result = suite.score({0: "a red circle", 1: "red red red"}, {})
    assert set(result.per_item["grammar"]) == {0, 1} and 0 <= result.corpus["grammar"] <= 1


def test_grammar_without_a_grammar_model_names_the_recipe(trained):
    clip, _ = trained
    with pytest.raises(ConfigError, match="python -m rewards.train_grammar"):
        RewardBank.from_config({"grammar": 1.0}, context(clip))
    with MetricSuite(["grammar"], context(clip), False) as suite:
        assert "train_grammar" in suite.skipped["grammar"]


def test_a_grammar_model_of_another_clip_is_refused(trained, tmp_path):
    _, head = trained
    other = save_open_clip(tmp_path / "other.safetensors", seed=9)
    with pytest.raises(DataError, match="trained from another CLIP"):
        RewardBank.from_config({"grammar": 1.0}, context(other, head))
