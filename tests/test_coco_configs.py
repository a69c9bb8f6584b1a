"""configs/coco/: every file loads into the config class of the command its comment names, with every
key checked (an unknown or mistyped key is an error), and the values the comments cite hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from captioner.prepro import PreproConfig
from captioner.scst import check_scst_config
from captioner.sweep import SweepConfig, check_sweep
from captioner.train_config import TrainConfig
from features.extract import ExtractConfig
from features.import_npz import ImportConfig
from plumbing.config import load_config
from plumbing.schedules import lr_factor
from rewards.recipes.clip import TrainClipConfig
from rewards.recipes.grammar import GrammarConfig
from rewards.score import ScoreConfig

ROOT = Path(__file__).resolve().parents[1]
COCO = ROOT / "configs" / "coco"
CLASSES = {"captioner.prepro": PreproConfig, "features.import_npz": ImportConfig, "features.extract": ExtractConfig,
           "captioner.train": TrainConfig, "captioner.sweep": SweepConfig, "rewards.score": ScoreConfig,
           "rewards.train_clip": TrainClipConfig, "rewards.train_grammar": GrammarConfig}


def command_of(path: Path) -> str:
    """The command the file's comment shows first (`python -m X` or `accelerate launch -m X`)."""
    return re.search(r"-m (\S+) --config", path.read_text()).group(1)


@pytest.mark.parametrize("path", sorted(COCO.glob("*.yaml")), ids=lambda p: p.name)
def test_every_coco_config_loads_into_its_commands_class(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    command = command_of(path)
    assert f"--config configs/coco/{path.name}" in path.read_text()
    cfg = load_config(CLASSES[command], path)
    if isinstance(cfg, TrainConfig) and cfg.train.stage == "scst":
        check_scst_config(cfg.scst)
        assert (cfg.scst.init_from or "").startswith("runs/coco/runs/coco_xe/")
    if isinstance(cfg, SweepConfig):
        check_sweep(cfg)


def test_the_reference_transformer_and_its_schedule():
    xe = load_config(TrainConfig, COCO / "xe.yaml")
    model = xe.model
    assert (model.enc_layers, model.dec_layers, model.d_model, model.d_ff, model.n_heads) == (6, 6, 512, 2048, 8)
    assert (xe.data.batch_size, xe.data.seq_per_img, xe.train.epochs) == (10, 5, 15)
    factor = lr_factor(xe.optim.warmup_steps, 10**6, xe.optim.schedule)
    peak = 512 ** -0.5 * 20000 ** -0.5  # NoamOpt, factor 1, at the end of warmup
    assert xe.optim.lr * factor(19999) == pytest.approx(peak)
    assert xe.optim.lr * factor(79999) == pytest.approx(512 ** -0.5 * 80000 ** -0.5)  # step^-0.5 after it
    greedy, nsc = (load_config(TrainConfig, COCO / name) for name in ("scst_cider_greedy.yaml", "scst_nsc.yaml"))
    assert (greedy.scst.baseline, greedy.scst.k, greedy.optim.lr) == ("greedy", 1, 1e-5)
    assert (nsc.scst.baseline, nsc.scst.k) == ("loo", 5)
    mix = load_config(TrainConfig, COCO / "scst_clip_mix.yaml")
    assert set(mix.reward_models) == {"clip", "specs", "lclip"} and mix.eval.select_by == "specs"


def test_a_coco_annotations_file_given_for_karpathys_is_named(tmp_path, capsys):
    from captioner import prepro

    annotations = tmp_path / "captions_val2014.json"
    annotations.write_text('{"images": [{"id": 391895, "file_name": "COCO_val2014_000000391895.jpg"}], '
                           '"annotations": [{"image_id": 391895, "caption": "a man riding a bike"}]}')
    assert prepro.main(["--config", str(COCO / "prepro.yaml"), "--set", f"dataset={annotations}",
                        "--set", f"out={tmp_path / 'data'}"]) == 2
    err = capsys.readouterr().err
    assert "looks like a COCO annotations file" in err and "dataset_coco.json" in err and err.count("\n") == 1
    assert not (tmp_path / "data").exists()
