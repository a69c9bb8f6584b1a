"""rewards.probe_relations: relation foils split by axis, and object centres read from the image embedding."""

from __future__ import annotations

import itertools
import json
import shutil

import torch

from features.world.parse import parse_caption
from features.world.scene import dominant_relation, load_scenes
from rewards import probe_relations
from rewards.recipes.data import load_split
from rewards.recipes.foil_report import FoilJudgement, split_foils
from rewards.recipes.mirror import AXES
from rewards.recipes.relation_probe import (
    AXIS_OF,
    FACTS,
    GROUPS,
    centre_targets,
    foil_directions,
    read_facts,
    read_positions,
    read_relations,
    stated_axes,
)


def test_stated_axes_are_the_axes_the_rendered_captions_state(tiny_world):
    """Checked with the world parser on the captions the foils are made from, not with the rule that
    chose the relations."""
    scenes = load_scenes(tiny_world / "scenes.json")
    split = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train")
    items = split_foils(split, scenes)
    seen = set()
    for image_id, item in zip(split.image_ids, items, strict=True):
        axes = stated_axes(scenes[image_id])
        for captions, field in (("short", "caption"), ("long", "long_caption")):
            stated = {AXIS_OF[relation] for _, relation, _ in parse_caption(item[field]).relations}
            if not stated:
                assert axes[captions] is None
                continue
            assert axes[captions] == (stated.pop() if len(stated) == 1 else "mixed"), item[field]
            seen.add(axes[captions])
    assert {"horizontal", "vertical"} <= seen


def position_code(scenes) -> torch.Tensor:
    """Each unique shape's and colour's centre, and whether it is there: a linear code of the positions."""
    targets = centre_targets(scenes)
    return torch.cat([torch.cat([targets[g].nan_to_num(0.0).flatten(1), (~targets[g].isnan()).float().flatten(1)], 1)
                      for g in GROUPS], 1)


def test_a_readout_of_an_embedding_that_holds_the_centres_orders_every_pair(tiny_world):
    scenes = list(load_scenes(tiny_world / "scenes.json").values())
    embedding = position_code(scenes)
    rows = read_positions(embedding, scenes, embedding, scenes)
    assert [r["axis"] for r in rows] == ["horizontal", "vertical"]
    for row in rows:
        assert row["r2"] > 0.99
        assert row["order_by_shape"] == row["order_by_colour"] == 1.0 and row["pairs_by_colour"] > 0
    shuffled = embedding[torch.randperm(len(embedding), generator=torch.Generator().manual_seed(0))]
    assert all(r["r2"] < 0.9 for r in read_positions(embedding, scenes, shuffled, scenes))


def test_relations_are_read_from_an_embedding_that_holds_the_centres_and_not_from_a_shuffled_one(tiny_world):
    """Vectors per colour and shape recover every relation from an embedding that codes where each
    colour and shape is (the form a text tower could compose), and not once its rows are shuffled."""
    scenes = list(load_scenes(tiny_world / "scenes.json").values())
    embedding = position_code(scenes)
    rows = read_relations(embedding, scenes, embedding, scenes)
    stated = [AXIS_OF[dominant_relation(a, b)] for s in scenes for a, b in itertools.combinations(s.objects, 2)]
    assert [(r["axis"], r["pairs"]) for r in rows] == [(axis, stated.count(axis)) for axis in AXES]
    assert all(r["fit_accuracy"] >= 0.95 and r["accuracy"] >= 0.95 for r in rows), rows
    shuffled = embedding[torch.randperm(len(embedding), generator=torch.Generator().manual_seed(0))]
    assert all(r["accuracy"] < 0.8 for r in read_relations(embedding, scenes, shuffled, scenes))


def test_a_readout_of_an_embedding_that_holds_the_facts_reads_every_one(tiny_world):
    """An embedding that one-hot codes each scene's facts is read without error; with its rows
    shuffled, no better than the commonest value by much."""
    scenes = list(load_scenes(tiny_world / "scenes.json").values())
    codes = []
    for value_of, values in FACTS.values():
        values = values or tuple(sorted({value_of(scene) for scene in scenes}))
        code = torch.zeros(len(scenes), len(values))
        for row, scene in enumerate(scenes):
            if value_of(scene) is not None:
                code[row, values.index(value_of(scene))] = 1.0
        codes.append(code)
    embedding = torch.cat(codes, 1)
    rows = read_facts(embedding, scenes, embedding, scenes)
    assert [r["fact"] for r in rows] == list(FACTS)
    assert all(r["accuracy"] == 1.0 and r["images"] > 0 for r in rows)
    assert rows[0]["images"] == len(scenes) and rows[2]["images"] == sum(len(s.objects) == 1 for s in scenes)
    generator = torch.Generator().manual_seed(0)
    shuffled = read_facts(embedding, scenes, embedding[torch.randperm(len(scenes), generator=generator)], scenes)
    assert shuffled[0]["accuracy"] < 0.6 and all(r["majority"] < 1.0 for r in shuffled[:2])


def test_foil_directions_put_a_kind_where_its_texts_differ_against_where_the_images_vary():
    """Images that vary along two of sixteen directions; one kind's foils differ along the loudest, another's
    along a direction no image varies in: the first lies in the top direction, the second outside the top 8."""
    generator = torch.Generator().manual_seed(0)
    images = torch.zeros(500, 16)
    images[:, 0] = 10.0  # the mean direction
    images[:, 1:3] = torch.randn(500, 2, generator=generator) * torch.tensor([2.0, 1.0])
    images[:, 3:] = torch.randn(500, 13, generator=generator) * 0.01
    loud, quiet = torch.eye(16)[1], torch.eye(16)[12]
    judged = [FoilJudgement(0, kind, "short", 1.0, 0.5, difference)
              for kind, difference in (("loud", loud), ("quiet", quiet), ("loud", -loud))]
    judged.append(FoilJudgement(0, "none", "short", 1.0, 0.5))  # no difference kept: not counted
    rows = {r["kind"]: r for r in foil_directions(images, judged, tops=(1, 2, 8, 32))}
    assert set(rows) == {"variance", "loud", "quiet"} and list(rows["variance"]["shares"]) == [1, 2, 8]
    assert rows["variance"]["shares"][2] > 0.95 and rows["variance"]["foils"] == 500
    assert rows["loud"]["shares"][1] > 0.99 and rows["loud"]["foils"] == 2
    assert rows["quiet"]["shares"][8] < 0.7  # one of the 13 near-silent directions, at random among them


def test_probe_prints_its_tables_and_writes_json(tiny_world, tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert probe_relations.main(["--arch", "world-clip-tiny", "--world", str(tiny_world), "--fit-split", "train",
                                 "--device", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "relation foils of random-init (val; clip_s, captions after 'A photo depicts '; chance 0.5)" in printed
    assert "order by colour" in printed
    assert "scene facts read linearly" in printed and "background" in printed
    assert "relations read from the image embedding by the best vectors" in printed
    result = json.loads(printed.strip().splitlines()[-1])
    assert result == json.loads(out.read_text())
    assert {r["captions"] for r in result["relation_foils"]} == {"short", "long"}
    short = [r for r in result["relation_foils"] if r["captions"] == "short"]
    assert sum(r["foils"] for r in short) == sum(len(s.objects) > 1 for s in (
        load_scenes(tiny_world / "scenes.json")[i] for i in load_split(
            str(tiny_world / "dataset.json"), str(tiny_world), "val").image_ids))
    assert all(0 <= r["accuracy"] <= 1 and -1 <= r["text_cosine"] <= 1 for r in result["relation_foils"])
    assert {r["fact"] for r in result["facts"]} >= {"background", "count"}
    assert [r["axis"] for r in result["relations"]] == ["horizontal", "vertical"]
    assert all(0 <= r["accuracy"] <= 1 and r["pairs"] > 0 for r in result["relations"])
    assert all(0 <= r["accuracy"] <= 1 and 0 < r["majority"] <= 1 for r in result["facts"])
    assert "where foils differ against where train images vary" in printed
    directions = result["foil_directions"]
    assert directions[0]["kind"] == "variance" and {r["kind"] for r in directions[1:]} >= {"relation", "shape"}
    for row in directions:
        shares = list(row["shares"].values())
        assert all(0 <= a <= b <= 1 + 1e-9 for a, b in zip(shares, shares[1:], strict=False)), row


def test_the_caption_prefix_is_what_the_text_tower_reads(tiny_world):
    """judge_foils puts the formula's own opening before every caption and foil, or the one it is given
    ('' reads them bare, as SPECS does): the token rows the text tower receives say which."""
    from features.clip_models.tokens import ClipTokenizer
    from rewards.recipes.foil_report import judge_foils

    val = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "val")
    items = split_foils(val, load_scenes(tiny_world / "scenes.json"))
    tokenizer = ClipTokenizer(248)

    def texts_read(prefix):
        seen = []

        def encode_text(tokens):
            seen.extend(tuple(i for i in row if i) for row in tokens.tolist())
            return torch.randn(len(tokens), 8)

        judge_foils(torch.randn(len(items), 8), encode_text, tokenizer, items, "clip_s", torch.device("cpu"), prefix)
        return seen

    captions = [it["caption"] for it in items] + [f["caption"] for it in items for f in it["foils"] if "caption" in f]
    for prefix, opening in ((None, "A photo depicts "), ("", ""), ("an image of ", "an image of ")):
        wanted = {tuple(ids) for ids in tokenizer.ids([opening + c for c in captions])}
        assert wanted <= set(texts_read(prefix)), prefix


def test_a_prefix_given_without_its_space_still_opens_the_caption():
    assert probe_relations.opening("an image of") == "an image of "
    assert probe_relations.opening("an image of ") == "an image of "
    assert probe_relations.opening("") == ""


def test_probe_names_a_missing_scenes_file_and_an_image_without_a_scene(tiny_world, tmp_path, capsys):
    world = tmp_path / "world"
    shutil.copytree(tiny_world, world)
    (world / "scenes.json").unlink()
    assert probe_relations.main(["--arch", "world-clip-tiny", "--world", str(world), "--device", "cpu"]) == 2
    assert "scenes.json: scenes file not found" in capsys.readouterr().err
    data = json.loads((tiny_world / "scenes.json").read_text())
    val_id = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "val").image_ids[3]
    del data["images"][str(val_id)]
    (world / "scenes.json").write_text(json.dumps(data))
    assert probe_relations.main(["--arch", "world-clip-tiny", "--world", str(world), "--device", "cpu"]) == 2
    assert f"scenes.json: no scene for image id {val_id}" in capsys.readouterr().err
