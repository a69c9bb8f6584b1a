from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from plumbing.config import INHERIT_KEY, dump_config, load_config, read_yaml
from plumbing.errors import ConfigError


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


@dataclass
class Model:
    kind: str = "open_clip"
    weights: str = ""


@dataclass
class WithModels(Demo):
    models: dict[str, Model] = field(default_factory=dict)


def test_an_inheriting_reward_mix_replaces_the_base_mix_but_sections_merge(tmp_path):
    """`rewards: {clip_s: 1}` over a base with `{cider_d: 1}` means clip_s alone, not both;
    keyed sub-configs (models) and sections (optim) still merge key by key."""
    (tmp_path / "base.yaml").write_text("rewards: {cider_d: 1.0}\noptim: {lr: 0.01}\n"
                                        "models: {clip: {weights: a.pt}, specs: {kind: longclip}}\n")
    (tmp_path / "child.yaml").write_text("inherit: base.yaml\nrewards: {clip_s: 1.0}\noptim: {betas: [0.5, 0.5]}\n"
                                         "models: {specs: {weights: s.pt}}\n")
    cfg = load_config(WithModels, tmp_path / "child.yaml")
    assert cfg.rewards == {"clip_s": 1.0}
    assert (cfg.optim.lr, cfg.optim.betas) == (0.01, [0.5, 0.5])
    assert cfg.models == {"clip": Model("open_clip", "a.pt"), "specs": Model("longclip", "s.pt")}


def test_the_project_scst_configs_hold_the_mix_they_name():
    from captioner.train_config import TrainConfig

    configs = Path(__file__).resolve().parents[1] / "configs"
    assert load_config(TrainConfig, configs / "scst_world_clip.yaml").scst.rewards == {"clip_s": 1.0}
    demo = load_config(TrainConfig, configs / "demo_scst.yaml")
    assert demo.scst.rewards == {"cider_d": 0.7, "clip_s": 0.3}
    assert demo.scst.normalize == "batch_z" and demo.scst.xe_weight > 0 and demo.train.epochs == 2
    assert sorted(demo.reward_models) == ["clip", "lclip", "specs"]


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


def test_yes_no_words_mean_what_the_field_type_says(tmp_path):
    @dataclass
    class Precision:
        mixed_precision: Literal["auto", "no", "bf16"] = "auto"
        name: str = "run"
        pooled: bool = False

    assert load_config(Precision, None, ["mixed_precision=no"]).mixed_precision == "no"
    (tmp_path / "p.yaml").write_text("mixed_precision: no\nname: off\npooled: yes\n")
    assert load_config(Precision, tmp_path / "p.yaml") == Precision("no", "off", True)
    with pytest.raises(ConfigError, match="'mixed_precision': 'yes' is not one of"):
        load_config(Precision, None, ["mixed_precision=yes"])
    assert load_config(Precision, None, ["pooled=off"]).pooled is False
    assert load_config(Precision, None, ["pooled=true"]).pooled is True
    with pytest.raises(ConfigError, match="'pooled': expected bool"):
        load_config(Precision, None, ["pooled=maybe"])


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


ROOT = Path(__file__).resolve().parents[1]


def shipped_config_kinds() -> dict[Path, type]:
    """Every YAML file under configs/ with the config class it fills (configs/coco/: test_coco_configs.py)."""
    from captioner.prepro import PreproConfig
    from captioner.sweep import SweepConfig
    from captioner.train_config import TrainConfig
    from features.extract import ExtractConfig
    from features.world.generate import WorldConfig
    from rewards.recipes.clip import TrainClipConfig
    from rewards.recipes.distill import DistillConfig
    from rewards.recipes.specs import TrainSpecsConfig
    from rewards.score import ScoreConfig

    kinds = {"ablate_alpha.yaml": SweepConfig, "world.yaml": WorldConfig, "prepro_world.yaml": PreproConfig,
             "features_patches.yaml": ExtractConfig, "world_clip.yaml": TrainClipConfig,
             "world_specs.yaml": TrainSpecsConfig, "world_lclip.yaml": DistillConfig,
             "scoring_world.yaml": ScoreConfig}

    def kind(path: Path) -> type:  # a config that inherits fills its base's class
        base = yaml.safe_load(path.read_text()).get(INHERIT_KEY)
        return kind(path.parent / base) if base else kinds.get(path.name, TrainConfig)

    return {path: kind(path) for path in sorted((ROOT / "configs").rglob("*.yaml"))
            if "coco" not in path.relative_to(ROOT / "configs").parts}


def test_the_world_configs_and_the_commands_name_one_world_clip_arch():
    """The commands that measure the world CLIP default to WORLD_CLIP_ARCH; every world config that
    builds or reads it must name the same arch, or its weights would load under other heads."""
    from features.clip_models.spec import WORLD_CLIP_ARCH

    configs = Path(__file__).resolve().parents[1] / "configs"
    named = [read_yaml(configs / "reward_models/world_clip.yaml")["arch"],
             read_yaml(configs / "reward_models/world_specs.yaml")["arch"],
             read_yaml(configs / "reward_models/world_lclip.yaml")["teacher_arch"],
             read_yaml(configs / "scoring_world.yaml")["reward_models"]["clip"]["arch"],
             read_yaml(configs / "scst_world_clip.yaml")["reward_models"]["clip"]["arch"]]
    assert named == [WORLD_CLIP_ARCH] * 5
    assert f"open_clip:{WORLD_CLIP_ARCH} " in (configs.parent / "scripts/demo.sh").read_text()


def test_every_shipped_config_loads():
    configs = shipped_config_kinds()
    assert len(configs) >= 9
    for path, kind in configs.items():
        load_config(kind, path)


def test_the_shipped_sweep_builds_one_scst_run_per_alpha():
    from captioner.sweep import SweepConfig, check_sweep, run_config

    cfg = load_config(SweepConfig, ROOT / "configs" / "ablate_alpha.yaml")
    check_sweep(cfg)
    cfg.base = str(ROOT / cfg.base)
    mixes = [run_config(cfg, alpha).scst.rewards for alpha in cfg.alphas]
    assert mixes[0] == {"clip_s": 0.0, "cider_d": 1.0} and mixes[-1] == {"clip_s": 1.0, "cider_d": 0.0}
    assert mixes[1] == {"clip_s": 0.3, "cider_d": 0.7}
    assert {run_config(cfg, a).run.name for a in cfg.alphas} == {"alpha_0", "alpha_0.3", "alpha_0.5", "alpha_0.7",
                                                                "alpha_1"}


def test_every_shipped_scst_start_has_the_model_shape_of_the_run_it_starts_from():
    """`scst.init_from` names a shipped XE run's checkpoint; the SCST model must be built like it."""
    from captioner.sweep import SweepConfig, run_config
    from captioner.train_config import TrainConfig

    trains = [load_config(kind, path) for path, kind in shipped_config_kinds().items() if kind is TrainConfig]
    sweep = load_config(SweepConfig, ROOT / "configs" / "ablate_alpha.yaml")
    sweep.base = str(ROOT / sweep.base)
    starts = [cfg for cfg in trains if cfg.scst.init_from] + [run_config(sweep, a) for a in sweep.alphas]
    models = {cfg.run.name: cfg.model for cfg in trains}
    assert len(starts) >= 5
    for cfg in starts:
        source = Path(cfg.scst.init_from).parts[-3]  # runs/.../<run name>/checkpoints/best
        assert cfg.model == models[source], f"{cfg.run.name}: model differs from run {source!r} it starts from"
