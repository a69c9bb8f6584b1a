"""The training config: one typed dataclass per section, filled from YAML + --set overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from captioner.model import ModelConfig
from captioner.scst import ScstConfig
from features.clip_models.spec import RewardModelSpec
from plumbing.references import load_references
from rewards import ScoringContext


@dataclass
class RunConfig:
    name: str = "run"
    out_dir: str = "runs"
    seed: int = 0


@dataclass
class DataConfig:
    labels: str = ""  # prepro's labels.h5
    vocab: str = ""  # prepro's vocab.json
    refs: str = ""  # prepro's refs.json
    feats: str = ""  # feats.h5
    cider_df: str | None = None  # prepro's cider_df.json.gz (cider_d metric/reward)
    scenes: str | None = None  # the offline world's scenes.json (grounding diagnostics)
    seq_per_img: int = 5
    batch_size: int = 50  # images per step per process
    workers: int = 2
    val_split: str = "val"
    max_val_images: int = 0  # 0 = all


@dataclass
class OptimConfig:
    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    warmup_steps: int = 500
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.05
    grad_clip: float = 1.0
    accumulation_steps: int = 1
    label_smoothing: float = 0.0


@dataclass
class TrainSection:
    epochs: int = 10
    stage: Literal["xe", "scst"] = "xe"
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = "auto"
    log_every: int = 20
    max_steps_per_epoch: int = 0  # 0 = the whole split (a knob for quick runs)
    scst_from_epoch: int = -1  # XE -> SCST schedule: epochs from this one on run SCST (-1 = never)


@dataclass
class EvalConfig:
    metrics: list[str] = field(default_factory=lambda: ["bleu_4", "rouge_l", "cider", "mean_length", "repeat_2"])
    decode: Literal["greedy", "beam"] = "greedy"
    beam_size: int = 3
    length_penalty: float = 0.0
    batch_size: int = 100
    select_by: str = "cider"
    select_mode: Literal["auto", "max", "min"] = "auto"  # auto: the metric's own direction
    show_samples: int = 8


@dataclass
class CheckpointConfig:
    keep_last: int = 3
    every_steps: int = 0  # also save mid-epoch every N optimizer steps (0 = only at epoch ends)


@dataclass
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    scst: ScstConfig = field(default_factory=ScstConfig)
    # CLIP-family reward models by key (clip, lclip, specs), shared by SCST rewards and eval metrics
    reward_models: dict[str, RewardModelSpec] = field(default_factory=dict)


def scoring_context(cfg: TrainConfig, device: str = "auto",
                    references: dict[int, list[str]] | None = None) -> ScoringContext:
    """The one place a training config becomes the scoring context its rewards and metrics share."""
    refs = load_references(cfg.data.refs) if references is None and cfg.data.refs else references
    return ScoringContext(references=refs or {}, cider_df=cfg.data.cider_df, cider_eos=cfg.scst.cider_eos,
                          scenes=cfg.data.scenes, reward_models=cfg.reward_models, device=device)
