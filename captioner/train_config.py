"""The training config: one typed dataclass per section, filled from YAML + --set overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from captioner.decoding import DecodeConfig
from captioner.model import ModelConfig
from captioner.scst import ScstConfig
from features.clip_models.spec import RewardModelSpec
from plumbing.config import option
from plumbing.plugins import import_plugins
from plumbing.references import load_references
from rewards import ScoringContext


@dataclass
class RunConfig:
    name: str = option("run", help="the run's folder name under out_dir")
    out_dir: str = option("runs", help="where run folders go")
    seed: int = option(0, help="random seed (model init, caption sampling, data order)")
    plugins: list[str] = option(factory=list, help="your modules that register rewards or metrics, imported before "
                                "the reward bank and the metric suite are built (docs/adding_a_reward.md)")


@dataclass
class DataConfig:
    labels: str = option("", help="prepro's labels.h5")
    vocab: str = option("", help="prepro's vocab.json")
    refs: str = option("", help="prepro's refs.json")
    feats: str = option("", help="feats.h5 from features.extract")
    cider_df: str | None = option(None, help="prepro's cider_df.json.gz (the cider_d metric and reward)")
    scenes: str | None = option(None, help="the offline world's scenes.json (grounding diagnostics)")
    seq_per_img: int = option(5, help="reference captions per image per step", at_least=1)
    batch_size: int = option(50, help="images per step per process", at_least=1)
    workers: int = option(2, help="DataLoader worker processes", at_least=0)
    val_split: str = option("val", help="the split evaluated every epoch")
    max_val_images: int = option(0, help="evaluate at most this many val images (0 = all)", at_least=0)


@dataclass
class OptimConfig:
    lr: float = option(5e-4, help="peak learning rate", above=0)
    weight_decay: float = option(0.01, help="AdamW weight decay", at_least=0)
    betas: list[float] = option(factory=lambda: [0.9, 0.98], help="AdamW betas", at_least=0, at_most=0.999999)
    warmup_steps: int = option(500, help="linear warmup steps", at_least=0)
    schedule: Literal["cosine", "linear", "constant", "noam"] = option(
        "cosine", help="decay after warmup (noam: the inverse square root of the step, the reference Transformer's)")
    min_lr_ratio: float = option(0.05, help="the rate never falls below this share of the peak", at_least=0,
                                 at_most=1)
    grad_clip: float = option(1.0, help="clip the gradient norm to this (0 = no clipping)", at_least=0)
    accumulation_steps: int = option(1, help="batches per optimizer step", at_least=1)
    label_smoothing: float = option(0.0, help="XE label smoothing", at_least=0, at_most=1)


@dataclass
class TrainSection:
    epochs: int = option(10, help="epochs to train", at_least=1)
    stage: Literal["xe", "scst"] = option("xe", help="xe (cross-entropy) or scst (self-critical) from the start")
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = option("auto", help="auto: bf16/fp16 on GPU, no on CPU")
    log_every: int = option(20, help="optimizer steps between logged training scalars", at_least=1)
    max_steps_per_epoch: int = option(0, help="cap the steps of an epoch (0 = the whole split)", at_least=0)
    scst_from_epoch: int = option(-1, help="XE -> SCST: epochs from this one on run SCST (-1 = never)", at_least=-1)


@dataclass
class EvalConfig(DecodeConfig):
    """The per-epoch val evaluation; its decoding keys are DecodeConfig's (eval.beam_size, ...)."""

    metrics: list[str] = option(factory=lambda: ["bleu_4", "rouge_l", "cider", "mean_length", "repeat_2"],
                                help="metrics computed on val every epoch")
    batch_size: int = option(100, help="val images per decoding batch", at_least=1)
    select_by: str = option("cider", help="the metric that marks the best checkpoint")
    select_mode: Literal["auto", "max", "min"] = option("auto", help="auto: the metric's own direction")
    show_samples: int = option(8, help="val captions shown in tensorboard each epoch", at_least=0)


@dataclass
class CheckpointConfig:
    keep_last: int = option(3, help="checkpoints kept besides best (0 = all)", at_least=0)
    every_steps: int = option(0, help="also save mid-epoch every N optimizer steps (0 = epoch ends only)", at_least=0)


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
    import_plugins(cfg.run.plugins)
    refs = load_references(cfg.data.refs) if references is None and cfg.data.refs else references
    return ScoringContext(references=refs or {}, cider_df=cfg.data.cider_df, cider_eos=cfg.scst.cider_eos,
                          scenes=cfg.data.scenes, reward_models=cfg.reward_models, device=device)
