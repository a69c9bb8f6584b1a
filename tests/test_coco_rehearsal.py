"""The COCO run rehearsed offline: every step of `python -m captioner.coco` with the unchanged
configs/coco/ shapes (the reference Transformer, the CLIP RN50 grid, ViT-B-32, LongCLIP-B and the L-CLIP
paper's student at their real sizes, random weights) on real COCO captions, only counts cut."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest

from captioner import coco as coco_cli
from captioner.checkpoint import read_checkpoint
from captioner.train_config import TrainConfig
from plumbing.config import load_config
from tests.captioner_fixtures import ROOT


def rehearse(out, inputs, *extra: str) -> int:
    return coco_cli.main(["rehearse", "--out", str(out), "--inputs", str(inputs), "--rehearsal-images", "40",
                          "--no-progress", *extra])


@pytest.fixture(scope="module")
def rehearsed(coco_stand_in, tmp_path_factory):
    out = tmp_path_factory.mktemp("coco") / "rehearsal"
    return out, rehearse(out, coco_stand_in.root)


def test_the_rehearsal_runs_every_step_at_the_real_sizes(rehearsed, coco_stand_in):
    out, code = rehearsed
    assert code == 0
    cfg = coco_cli.with_rehearsal_inputs(coco_cli.CocoConfig(mode="rehearse", out=str(out),
                                                             inputs=str(coco_stand_in.root)))
    plan = coco_cli.steps(cfg, rehearse=True)
    assert [step.key for step in plan] == [
        "prepro", "bottomup", "grid", "embeds_clip", "embeds_specs", "embeds_lclip", "xe", "scst_nsc",
        "scst_cider_greedy", "scst_clip_mix", "sweep", "select", "evaluate", "score"]
    assert [step.key for step in plan if not Path(step.output).exists()] == []
    with h5py.File(out / "feats" / "bottomup.h5") as h5:
        assert h5["att"].shape[2] == 2048 and h5["att"].shape[1] <= 100
    with h5py.File(out / "feats" / "clip_rn50.h5") as h5:
        assert h5["att"].shape[1:] == (49, 2048)  # RN50's 7 x 7 x 2048 map at 224 px
    for key in ("clip", "specs", "lclip"):
        with h5py.File(out / "embeds" / f"{key}.h5") as h5:
            assert h5["image"].shape == (40, 512)
    _, saved, _ = read_checkpoint(out / "runs" / "coco_scst_clip_mix" / "checkpoints" / "best")
    assert saved["model"] == json.loads(json.dumps(_model_of("xe.yaml")))  # 6 + 6 layers, d 512, d_ff 2048
    records = [json.loads(line) for line in (out / "runs" / "coco_scst_clip_mix" / "metrics.jsonl").read_text()
               .splitlines()]
    assert {"clip_s", "specs", "l_clip_s", "cider_d", "meteor"} <= set(records[-1])
    summary = (out / "sweeps" / "alpha" / "summary.md").read_text()
    assert "mean over its seeds" in summary
    scores = json.loads((out / "test_clip_mix.scores.json").read_text())
    assert {"clip_s", "specs", "l_clip_s", "cider"} <= set(scores["corpus"])


def _model_of(name: str) -> dict:
    from dataclasses import asdict

    return asdict(load_config(TrainConfig, ROOT / "configs" / "coco" / name).model)


def test_a_second_run_skips_what_is_done(rehearsed, coco_stand_in, capsys):
    out, _ = rehearsed
    capsys.readouterr()
    assert rehearse(out, coco_stand_in.root, "--only", "prepro,bottomup,xe,scst_clip_mix,sweep") == 0
    text = capsys.readouterr().out
    assert "up to date" in text and "already holds these features" in text
    assert text.count("finished earlier") == 4  # XE, the mix, and the sweep's two runs


def test_missing_inputs_are_named_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert coco_cli.main(["run", "--dataset", "nope.json"]) == 2
    assert "--dataset nope.json: not found" in capsys.readouterr().err
    (tmp_path / "d.json").write_text("{}")
    (tmp_path / "images").mkdir()
    for name in ("spec.pt", "lclip.ckpt"):
        (tmp_path / name).write_bytes(b"")
    assert coco_cli.main(["run", "--dataset", "d.json", "--images", "images", "--spec", "spec.pt", "--lclip",
                          "lclip.ckpt"]) == 2
    assert "--features bottomup needs --bottomup-att" in capsys.readouterr().err
