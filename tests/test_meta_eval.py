"""Metric meta-evaluation: Kendall τ against scipy, every user-facing format parsed and scored,
malformed entries named, and world foils that are wrong by construction."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import binomtest, kendalltau

from features.world import lexicon
from features.world.foils import reference_foils, world_foils
from features.world.parse import contradictions, parse_caption
from features.world.reworded import KINDS as REWORDED_KINDS
from features.world.reworded import reworded_foils
from features.world.scene import load_scenes
from plumbing.karpathy import load_dataset
from rewards import meta_eval
from rewards.meta.correlation import kendall_tau, pearson
from rewards.meta.paired import compare_outcomes, sign_test
from rewards.recipes.data import long_captions

REFS = ["a dog runs on the grass", "a brown dog running in a park", "a dog plays outside"]
OTHER_REFS = ["a red bus on a city street", "a bus parked near a sign", "the bus is red"]


@pytest.mark.parametrize("variant", ["b", "c"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kendall_equals_scipy_with_ties(variant, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 400))
    x = rng.integers(0, 6, n).astype(float)  # many ties
    y = np.where(rng.random(n) < 0.5, x, rng.integers(0, 4, n)).astype(float)
    assert kendall_tau(x, y, variant) == pytest.approx(kendalltau(x, y, variant=variant).statistic, abs=1e-12)
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)


def _run(tmp_path, task: str, entries: list, *extra: str) -> dict:
    path = tmp_path / f"{task}.json"
    path.write_text(json.dumps(entries))
    out = tmp_path / f"{task}_out.json"
    assert meta_eval.main([task, "--data", str(path), "--metrics", "bleu_4,cider", "--out", str(out),
                           "--markdown", str(tmp_path / f"{task}.md"), *extra]) == 0
    assert (tmp_path / f"{task}.md").read_text().startswith("### ")
    return json.loads(out.read_text())["results"]


def test_foil_format(tmp_path):
    entries = [{"image_id": 1, "caption": "a brown dog runs on the grass", "references": REFS,
                "foils": [{"caption": "a brown cat runs on the grass", "kind": "object"},
                          {"caption": "a car", "kind": "added"}]},
               {"image_id": 2, "caption": "a red bus on the street", "references": OTHER_REFS,
                "foils": [{"caption": "a red car in a kitchen", "kind": "object"}]}]
    result = _run(tmp_path, "foil", entries)
    assert set(result["short"]["bleu_4"]) == {"all", "mean", "object", "added"}
    assert result["short"]["cider"]["added"] == 1.0


def test_pairs_format_prefers_the_human_choice(tmp_path):
    entries = [{"image_id": 1, "candidates": ["a dog runs on the grass", "a plate of food"], "references": REFS,
                "preference": 0, "category": "HI"},
               {"image_id": 2, "candidates": ["two cats", "a red bus on a street"], "references": OTHER_REFS,
                "preference": 1, "category": "HM"}]
    result = _run(tmp_path, "pairs", entries)
    assert result["cider"] == {"HI": 1.0, "HM": 1.0, "all": 1.0, "mean": 1.0}


def test_mean_weighs_each_category_once(tmp_path):
    """Three won HI pairs and one lost HM pair: 0.75 over the items, 0.5 over the categories."""
    dog = {"candidates": ["a dog runs on the grass", "a plate of food"], "references": REFS}
    bus = {"candidates": ["a red bus on a street", "two cats"], "references": OTHER_REFS}
    entries = [{**dog, "image_id": 0, "preference": 0, "category": "HI"},
               {**bus, "image_id": 1, "preference": 0, "category": "HI"},
               {**dog, "image_id": 2, "preference": 0, "category": "HI"},
               {**bus, "image_id": 3, "preference": 1, "category": "HM"}]
    result = _run(tmp_path, "pairs", entries)
    assert result["cider"] == {"HI": 1.0, "HM": 0.0, "all": 0.75, "mean": 0.5}
    entries[3]["category"] = "mean"  # a category of that name is not overwritten by the mean
    result = _run(tmp_path, "pairs", entries)
    assert result["cider"] == {"HI": 1.0, "mean": 0.0, "all": 0.75}


def test_human_format_correlates(tmp_path):
    candidates = ["a dog runs on the grass", "a brown dog in a park", "a dog", "a plate of food on a table"]
    entries = [{"image_id": 1, "candidate": c, "references": REFS, "ratings": [r, r]}
               for c, r in zip(candidates, [4, 3, 2, 1], strict=True)]
    entries += [{"image_id": 2, "candidate": "a red bus", "references": OTHER_REFS, "ratings": [4]}]
    entries[0] = {**entries[0], "rating": 4.0}
    del entries[0]["ratings"]
    result = _run(tmp_path, "human", entries)
    assert result["cider"]["tau_b"] > 0.5 and result["cider"]["items"] == 5


def test_equal_ratings_give_no_correlation_not_a_crash(tmp_path, capsys):
    """Constant ratings leave τ and r undefined: null in the JSON, n/a in the table (the JSON writer
    refuses NaN, so this was an error after scoring)."""
    entries = [{"image_id": 1, "candidate": c, "references": REFS, "rating": 3}
               for c in ("a dog runs on the grass", "a brown dog", "a plate of food")]
    result = _run(tmp_path, "human", entries)
    assert result["cider"] == {"tau_b": None, "tau_c": None, "pearson": None, "items": 3}
    assert "| cider | n/a | n/a | n/a |" in (tmp_path / "human.md").read_text()
    assert "every caption has the same mean rating" in capsys.readouterr().err


def test_a_missing_data_file_is_named_before_any_model_loads(tmp_path, capsys):
    missing = tmp_path / "none.json"
    code = meta_eval.main(["foil", "--data", str(missing), "--metrics", "clip_s",
                           "--config", "configs/scoring_world.yaml"])
    assert code == 2 and f"{missing}: file not found" in capsys.readouterr().err


@pytest.mark.parametrize(("task", "entry", "needle"), [
    ("foil", {"image_id": 7, "caption": "x", "references": REFS, "foils": []}, "image id 7"),
    ("foil", {"image_id": 7, "caption": 3, "references": REFS, "foils": [{"caption": "y"}]}, "'caption' must be"),
    ("foil", {"image_id": 7, "text": "x", "references": REFS, "foils": [{"caption": "y"}]},
     "entry 0 (image id 7): needs 'caption'"),
    ("foil", {"image_id": 7, "long_caption": "x", "references": REFS, "foils": [{"caption": "y"}]},
     "no foil shares a field"),
    ("pairs", {"image_id": 8, "candidates": ["a"], "references": REFS, "preference": 0}, "two strings"),
    ("pairs", {"image_id": 8, "candidates": ["a", "b"], "references": REFS, "preference": 2}, "0 or 1"),
    ("pairs", {"image_id": 8, "candidates": ["a", "b"], "references": REFS, "preference": True}, "got True"),
    ("human", {"image_id": 9, "candidate": "a", "references": REFS}, "ratings"),
    ("human", {"image_id": 9, "candidate": "a", "ratings": [1]}, "references"),
    ("human", {"image_id": "nine", "candidate": "a"}, "entry 0 needs an integer 'image_id'"),
    ("human", {"image_id": 9, "candidate": "a", "references": REFS, "ratings": [True]}, "got [True]"),
    ("human", {"image_id": 9, "candidate": "a", "references": REFS, "ratings": [float("nan")]}, "got [nan]"),
    ("human", {"image_id": 9, "candidate": "a", "references": REFS, "rating": 3}, "at least two rated captions, got 1"),
])
def test_malformed_entries_are_named(tmp_path, capsys, task, entry, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([entry]))
    assert meta_eval.main([task, "--data", str(path), "--metrics", "bleu_4"]) == 2
    assert needle in capsys.readouterr().err


def test_world_foils_are_wrong_by_construction(tiny_world, tmp_path):
    scenes = load_scenes(tiny_world / "scenes.json")
    ids = sorted(scenes)[:12]
    items = world_foils(scenes, {}, ids, seed=3)
    assert items == world_foils(scenes, {}, ids, seed=3)  # deterministic
    kinds = {f["kind"] for item in items for f in item["foils"]}
    assert kinds == {"shape", "color", "added", "relation"}
    for item in items:
        scene = scenes[item["image_id"]]
        truth = {(o.color, o.shape) for o in scene.objects}
        said = {(m.color, m.shape) for m in parse_caption(item["caption"]).mentions}
        assert said <= truth  # the correct caption only names objects that are there
        for foil in item["foils"]:
            named = {(m.color, m.shape) for m in parse_caption(foil["caption"]).mentions}
            if foil["kind"] in ("shape", "color", "added"):
                assert named - truth, foil  # names an object the scene does not have
            else:
                assert foil["caption"] != item["caption"] and named == said
    assert meta_eval.main(["world-foils", "--scenes", str(tiny_world / "scenes.json"), "--dataset",
                           str(tiny_world / "dataset.json"), "--out", str(tmp_path / "f.json")]) == 0
    written = json.loads((tmp_path / "f.json").read_text())
    assert written and all(item["references"] for item in written)


def test_reference_foils_are_false_in_the_references_wording(tiny_world, tmp_path):
    scenes = load_scenes(tiny_world / "scenes.json")
    entries = load_dataset(tiny_world / "dataset.json")[:20]
    captions = {e.image_id: (e.raw_captions, long_captions(e)) for e in entries}
    items = reference_foils(scenes, captions, [e.image_id for e in entries], seed=1)
    assert items == reference_foils(scenes, captions, [e.image_id for e in entries], seed=1)  # deterministic
    kinds = {f["kind"] for item in items for f in item["foils"]}
    assert {"shape", "color", "relation", "place", "size", "texture", "count", "background"} <= kinds
    for item in items:
        shorts, longs = captions[item["image_id"]]
        assert item["caption"] == shorts[0] and item["long_caption"] == longs[0]
        assert item["caption"] not in item["references"]
        for field in ("caption", "long_caption"):
            assert not contradictions(parse_caption(item[field]), scenes[item["image_id"]])
        for foil in item["foils"]:
            assert {"caption", "long_caption"} & set(foil)
            for field in {"caption", "long_caption"} & set(foil):  # checked by the parser, not the builder
                assert contradictions(parse_caption(foil[field]), scenes[item["image_id"]]), foil


def test_a_foil_of_one_length_is_scored_in_that_set_only(tmp_path):
    entries = [{"image_id": 1, "caption": "a dog runs on the grass", "long_caption": "a brown dog runs on the grass",
                "references": REFS, "foils": [{"kind": "object", "caption": "a red car in a kitchen"},
                                              {"kind": "place", "long_caption": "a brown dog runs in a kitchen"}]}]
    result = _run(tmp_path, "foil", entries)
    assert set(result["short"]["cider"]) == {"object", "all"}
    assert set(result["long"]["cider"]) == {"place", "all"}
    bad = [{**entries[0], "foils": [{"kind": "object", "text": "a red car"}]}]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert meta_eval.main(["foil", "--data", str(tmp_path / "bad.json"), "--metrics", "bleu_4"]) == 2


def test_items_of_one_length_are_scored_in_that_set_and_the_rest_is_counted(tmp_path, capsys):
    both = {"image_id": 1, "caption": "a dog runs on the grass", "long_caption": "a brown dog runs on the grass",
            "references": REFS, "foils": [{"kind": "place", "caption": "a dog runs in a kitchen",
                                           "long_caption": "a brown dog runs in a kitchen"}]}
    short_only = {"image_id": 2, "caption": "a dog plays outside", "references": REFS,
                  "foils": [{"kind": "object", "caption": "a cat plays outside"}]}
    long_only = {"image_id": 3, "long_caption": "a brown dog running in a park", "references": REFS,
                 "foils": [{"kind": "object", "long_caption": "a brown cat running in a park"}]}
    result = _run(tmp_path, "foil", [both, short_only, long_only])
    assert set(result["short"]["cider"]) == {"place", "object", "all", "mean"}
    assert set(result["long"]["cider"]) == {"place", "object", "all", "mean"}
    err = capsys.readouterr().err
    assert "the long set scores 2 of 3 entries" in err and "the short set scores 2 of 3 entries" in err
    no_long_foils = {**both, "foils": [{"kind": "place", "caption": "a dog runs in a kitchen"}]}
    assert set(_run(tmp_path, "foil", [no_long_foils, short_only])) == {"short"}
    assert "none of their foils does; no long set" in capsys.readouterr().err


def test_world_foils_name_an_image_without_a_scene(tiny_world, tmp_path, capsys):
    scenes = json.loads((tiny_world / "scenes.json").read_text())
    train = [e.image_id for e in load_dataset(tiny_world / "dataset.json") if e.split == "train"]
    first = train[0]
    del scenes["images"][str(first)]
    (tmp_path / "scenes.json").write_text(json.dumps(scenes))
    for source in ("rendered", "references"):
        assert meta_eval.main(["world-foils", "--scenes", str(tmp_path / "scenes.json"), "--dataset",
                               str(tiny_world / "dataset.json"), "--split", "train", "--source", source,
                               "--out", str(tmp_path / "f.json")]) == 2
        assert f"image id {first}" in capsys.readouterr().err


def _relation_phrase(text: str) -> tuple[str, str]:
    """(relation, the words around it) of a reworded relation statement: the phrase the lexicon gives."""
    for relation, phrases in lexicon.RELATION_PHRASES.items():
        if (phrase := phrases[0]) in text:
            return relation, text.replace(phrase, "<rel>")
    raise AssertionError(text)


def test_reworded_foils_state_the_scene_and_change_one_fact(tiny_world, tmp_path):
    """Checked against the scene through the parser's mentions, not the frames that built them: the
    true caption holds, its foil differs in the one fact its kind names."""
    scenes = load_scenes(tiny_world / "scenes.json")
    ids = sorted(scenes)[:40]
    items = reworded_foils(scenes, {}, ids, seed=2)
    assert items == reworded_foils(scenes, {}, ids, seed=2)  # deterministic
    assert {f["kind"] for item in items for f in item["foils"]} == set(REWORDED_KINDS)
    for item in items:
        scene = scenes[item["image_id"]]
        for foil in item["foils"]:
            kind, true, false = foil["kind"], item["caption"], foil["caption"]
            if kind in ("shape", "color", "count", "background", "relation_located", "relation_seen"):
                assert not contradictions(parse_caption(true), scene), true  # the parser reads these frames
                assert contradictions(parse_caption(false), scene), false
            elif kind == "color_predicate":
                shape, color = true.split()[1], true.split()[-1]
                assert [o.color for o in scene.objects if o.shape == shape] == [color]
                assert false.split()[-1] != color and false.split()[:-1] == true.split()[:-1]
            else:  # the subject is the second object named: "above the blue star there is a red circle"
                relation, frame = _relation_phrase(true)
                assert _relation_phrase(false) == (lexicon.INVERSE[relation], frame)
                obj, subject = [[o for o in scene.objects if (o.color, o.shape) == (m.color, m.shape)]
                                for m in parse_caption(true).mentions]
                assert len(obj) == len(subject) == 1 and scene.holds(subject[0].id, relation, obj[0].id)
    assert meta_eval.main(["world-foils", "--scenes", str(tiny_world / "scenes.json"), "--dataset",
                           str(tiny_world / "dataset.json"), "--source", "reworded", "--out",
                           str(tmp_path / "f.json")]) == 0
    assert json.loads((tmp_path / "f.json").read_text())


@pytest.mark.parametrize(("wins_a", "wins_b"), [(0, 0), (1, 0), (4, 0), (2, 6), (10, 10), (31, 12), (0, 40),
                                                (150, 171)])
def test_the_sign_test_equals_scipy_binomtest(wins_a, wins_b):
    expected = 1.0 if wins_a + wins_b == 0 else binomtest(wins_a, wins_a + wins_b, 0.5).pvalue
    assert sign_test(wins_a, wins_b) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_compared_outcomes_count_only_the_items_the_two_judge_apart():
    a = [("shape", 1.0), ("shape", 1.0), ("shape", 0.0), ("shape", 0.5), ("color", 1.0), ("color", 0.0)]
    b = [("shape", 1.0), ("shape", 0.0), ("shape", 1.0), ("shape", 0.0), ("color", 1.0), ("color", 0.0)]
    table = compare_outcomes(a, b)
    assert table["shape"] == {"a": 2, "b": 1, "p": 1.0}  # a tie above a loss counts for a
    assert table["color"] == {"a": 0, "b": 0, "p": 1.0}
    assert table["all"] == {"a": 2, "b": 1, "p": 1.0}
    with pytest.raises(ValueError, match="same items"):
        compare_outcomes(a, b[::-1])


def test_foil_comparison_names_the_items_each_metric_gets_right_alone(tmp_path):
    """CIDEr prefers each true caption (its image's reference word for word); mean length prefers the
    longer text, which is the foil in the three 'added' items: 3 items CIDEr alone gets right, none the
    other way."""
    long_foil = "an old wooden boat floating slowly across a calm green lake under grey clouds"
    scenes = [(REFS, "a dog runs on the grass"), (OTHER_REFS, "a red bus on a city street"),
              (["a plate of food on a table", "a meal on a white plate"], "a plate of food on a table"),
              (["two cats sleep on a sofa", "a pair of cats on a couch"], "two cats sleep on a sofa")]
    entries = [{"image_id": 1, "caption": scenes[0][1], "references": scenes[0][0],
                "foils": [{"caption": "a cat", "kind": "object"}]}]
    entries += [{"image_id": 1 + k, "caption": caption, "references": refs,
                 "foils": [{"caption": long_foil, "kind": "added"}]} for k, (refs, caption) in enumerate(scenes[1:], 1)]
    path = tmp_path / "foil.json"
    path.write_text(json.dumps(entries))
    out = tmp_path / "out.json"
    assert meta_eval.main(["foil", "--data", str(path), "--metrics", "cider,mean_length", "--out", str(out),
                           "--compare", "cider:mean_length", "--markdown", str(tmp_path / "foil.md")]) == 0
    saved = json.loads(out.read_text())
    assert saved["results"]["short"]["mean_length"]["added"] == 0.0
    compared = saved["comparisons"]["short"]["cider:mean_length"]
    assert compared["added"] == {"a": 3, "b": 0, "p": 0.25} and compared["object"] == {"a": 0, "b": 0, "p": 1.0}
    assert "### foil: short: cider against mean_length" in (tmp_path / "foil.md").read_text()


@pytest.mark.parametrize(("task", "spec", "needle"), [
    ("foil", "cider", "not two different metric names"),
    ("foil", "cider:cider", "not two different metric names"),
    ("foil", "cider:bleu_4", "'bleu_4' is not among the scored metrics (cider)"),
    ("human", "cider:bleu_4", "the human task has no per-item outcomes"),
])
def test_a_bad_comparison_is_named_before_scoring(tmp_path, capsys, task, spec, needle):
    path = tmp_path / "missing.json"  # never read: the comparison is checked first
    assert meta_eval.main([task, "--data", str(path), "--metrics", "cider", "--compare", spec]) == 2
    assert needle in capsys.readouterr().err


def test_pairs_comparison_counts_the_pairs_each_metric_alone_prefers_rightly(tmp_path):
    """Humans prefer the fitting caption, and in the two 'long' pairs it is the shorter one: CIDEr gets
    those right and mean length wrong; in the 'short' pair both prefer the fitting, longer caption."""
    entries = [{"image_id": 1, "candidates": ["a dog runs on the grass", "a dog"], "references": REFS,
                "preference": 0, "category": "short"}]
    boat = "an old wooden boat floating slowly across a calm green lake"
    entries += [{"image_id": 2 + k, "candidates": [boat, caption],
                 "references": refs, "preference": 1, "category": "long"}
                for k, (refs, caption) in enumerate([(OTHER_REFS, "a red bus on a city street"),
                                                     (["two cats sleep on a sofa", "cats on a couch"],
                                                      "two cats sleep on a sofa")])]
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(entries))
    out = tmp_path / "out.json"
    assert meta_eval.main(["pairs", "--data", str(path), "--metrics", "cider,mean_length", "--out", str(out),
                           "--compare", "cider:mean_length"]) == 0
    compared = json.loads(out.read_text())["comparisons"]["pairs"]["cider:mean_length"]
    assert compared == {"long": {"a": 2, "b": 0, "p": 0.5}, "short": {"a": 0, "b": 0, "p": 1.0},
                        "all": {"a": 2, "b": 0, "p": 0.5}}
