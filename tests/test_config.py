from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from captioner.config import dump_config, load_config, read_yaml
from captioner.errors import ConfigError


@dataclass
class Optim:
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class Demo:
    name: str = "run"
    epochs: int = 1
    stage: Literal["xe", "scst"] = "xe"
    rewards: dict[str, float] = field(default_factory=dict)
    optim: Optim = field(default_factory=Optim)
    init_from: str | None = None


def test_inherit_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("name: base\nepochs: 3\noptim:\n  lr: 0.01\n")
    (tmp_path / "child.yaml").write_text("inherit: base.yaml\nname: child\nrewards: {cider_d: 0.3, clip_s: 0.7}\n")
    cfg = load_config(Demo, tmp_path / "child.yaml", ["optim.lr=5e-4", "stage=scst", "init_from=ckpt/last"])
    assert (cfg.name, cfg.epochs, cfg.stage, cfg.init_from) == ("child", 3, "scst", "ckpt/last")
    assert cfg.optim.lr == 5e-4 and cfg.optim.betas == [0.9, 0.999]
    assert cfg.rewards == {"cider_d": 0.3, "clip_s": 0.7}


def test_unknown_key_names_it_and_lists_valid_keys(tmp_path):
    (tmp_path / "c.yaml").write_text("optim:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(Demo, tmp_path / "c.yaml")
    assert "'optim.lrr'" in str(err.value) and "betas, lr" in str(err.value)
    with pytest.raises(ConfigError, match="'epoch'.*valid keys here: .*epochs"):
        load_config(Demo, None, ["epoch=3"])


@pytest.mark.parametrize("override,needle", [
    ("epochs=three", "'epochs': expected int"),
    ("epochs=1.5", "'epochs': expected int"),
    ("stage=rl", "'stage'"),
    ("optim.betas=0.9", "'optim.betas': expected a list"),
    ("rewards.cider_d=high", "'rewards.cider_d': expected float"),
])
def test_wrong_types_are_errors(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(Demo, None, [override])


def test_inherit_cycle_and_missing_file(tmp_path):
    (tmp_path / "a.yaml").write_text("inherit: b.yaml\n")
    (tmp_path / "b.yaml").write_text("inherit: a.yaml\n")
    with pytest.raises(ConfigError, match="inherit cycle"):
        read_yaml(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="not found"):
        read_yaml(tmp_path / "nope.yaml")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(Demo, None, ["rewards={cider_d: 1}", "optim.lr=0.5"])
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(Demo, tmp_path / "resolved.yaml") == cfg


def test_every_shipped_config_loads():
    from pathlib import Path

    from captioner.prepro import PreproConfig
    from captioner.train_config import TrainConfig
    from captioner.world.generate import WorldConfig
    from features.extract import ExtractConfig
    from rewards.distill_lclip import DistillConfig
    from rewards.train_clip import TrainClipConfig
    from rewards.train_specs import TrainSpecsConfig

    kinds = {"world.yaml": WorldConfig, "prepro_world.yaml": PreproConfig, "features_patches.yaml": ExtractConfig,
             "world_clip.yaml": TrainClipConfig, "world_specs.yaml": TrainSpecsConfig, "world_lclip.yaml": DistillConfig}
    configs = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))
    assert len(configs) >= 9
    for path in configs:
        load_config(kinds.get(path.name, TrainConfig), path)
