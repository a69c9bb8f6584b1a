"""The scoring context: everything rewards and metrics are built from, one object per process.

It holds the references by image id, the training corpus's CIDEr document frequencies (read
once), the world's scene graphs (read once) and the one CLIP-family model set of the process
(loaded on first use). The reward bank and the metric suite of a run share one context, so a
model or a document-frequency table is never loaded twice. Training builds it from its config in
one place (`captioner.train_config.scoring_context`); the scoring commands from `ScoringSettings`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from features.clip_models.spec import RewardModelSpec
from plumbing.config import option
from plumbing.errors import ConfigError
from plumbing.plugins import import_plugins

if TYPE_CHECKING:
    from features.world.scene import Scene
    from rewards.clip.family import ClipFamily


@dataclass
class ScoringSettings:
    """The config keys a scoring command shares (rewards.score, rewards.meta_eval)."""

    cider_df: str | None = option(None, help="cider_df.json.gz from captioner.prepro (enables cider_d)")
    cider_eos: bool = option(False, help="cider_d counts EOS as a word (as the reference SCST code)")
    scenes: str | None = option(None, help="the offline world's scenes.json (enables the grounding diagnostics)")
    tokenizer: Literal["python", "java"] = option(
        "python", help="PTB tokenizer: pure Python (same output) or pycocoevalcap's Java one")
    reward_models: dict[str, RewardModelSpec] = option(
        factory=dict, help="CLIP-family reward models by key (clip, specs, lclip): kind, arch, weights, embeds")
    device: str = option("auto", help="auto (the GPU when present), cpu or cuda")
    plugins: list[str] = option(factory=list, help="your modules that register rewards or metrics, imported first "
                                "(docs/adding_a_reward.md)")


@dataclass
class ScoringContext:
    references: Mapping[int, Sequence[str]] = field(default_factory=dict)
    cider_df: str | None = None
    cider_eos: bool = False
    scenes: str | None = None
    tokenizer: Literal["python", "java"] = "python"
    reward_models: Mapping[str, RewardModelSpec] = field(default_factory=dict)
    device: str = "auto"

    @classmethod
    def from_settings(cls, settings: ScoringSettings,
                      references: Mapping[int, Sequence[str]] | None = None) -> ScoringContext:
        import_plugins(settings.plugins)
        return cls(references=references or {}, cider_df=settings.cider_df, cider_eos=settings.cider_eos,
                   scenes=settings.scenes, tokenizer=settings.tokenizer, reward_models=settings.reward_models,
                   device=settings.device)

    @cached_property
    def document_frequencies(self) -> tuple[dict[tuple[str, ...], int], int]:
        """(df by n-gram, number of documents) of the training corpus, with or without EOS n-grams."""
        from rewards.text.cider_df import load_df

        if not self.cider_df:
            raise ConfigError("cider_d needs training-corpus document frequencies (data.cider_df / --cider-df, "
                              "written by captioner.prepro)")
        return load_df(self.cider_df, self.cider_eos)

    def document_frequency_problem(self) -> str | None:
        """Why cider_d cannot be computed here, or None."""
        if not self.cider_df:
            return "cider_d needs training-corpus document frequencies (--cider-df, written by captioner.prepro)"
        return None if Path(self.cider_df).exists() else f"cider_d: {self.cider_df} not found"

    @cached_property
    def world_scenes(self) -> dict[int, Scene]:
        from features.world.scene import load_scenes

        if not self.scenes:
            raise ConfigError("grounding diagnostics need the offline world's scenes.json (data.scenes / --scenes)")
        return load_scenes(self.scenes)

    @cached_property
    def clip_family(self) -> ClipFamily:
        """The process's CLIP-family models, shared by every CLIP-family reward and metric."""
        from rewards.clip.family import ClipFamily

        return ClipFamily(self.reward_models, self.device)

    def require_references(self, what: str) -> Mapping[int, Sequence[str]]:
        if not self.references:
            raise ConfigError(f"{what} needs reference captions (data.refs)")
        return self.references

