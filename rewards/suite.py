"""The metric suite: any subset of metrics by name, corpus and per-item scores, one registry.

A metric family registers once with the names it produces and a factory that receives the
MetricContext (paths and options); later families (the CLIP-family scores) join the same
registry with `register_metric`, with no change here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, Self

import numpy as np

from captioner.errors import ConfigError, RlcapError
from rewards.batch import EvalBatch
from rewards.ptb import ptb_tokenize


@dataclass
class MetricContext:
    """What metric factories may need. `options` carries family-specific settings."""

    cider_df: str | None = None
    cider_eos: bool = False
    scenes: str | None = None
    tokenizer: str = "python"  # or "java" (pycocoevalcap's PTBTokenizer)
    options: dict[str, Any] = field(default_factory=dict)
    reward_models: dict[str, Any] = field(default_factory=dict)  # key -> RewardModelSpec (CLIP family)
    device: str = "auto"
    shared: dict[str, Any] = field(default_factory=dict)  # shared with the reward bank (one ClipFamily)


class ScoringData:
    """Predictions and references of one scoring call, tokenised once and shared by all metrics."""

    def __init__(self, ids: Sequence[int], candidates: Sequence[str], references: Sequence[Sequence[str]],
                 tokenizer: str = "python"):
        self.ids = list(ids)
        self.raw_candidates = list(candidates)
        self.raw_references = [list(r) for r in references]
        tokenize = _tokenizer(tokenizer)
        flat = tokenize([*self.raw_candidates, *(r for refs in self.raw_references for r in refs)])
        self.candidates = flat[: len(self.ids)]
        it = iter(flat[len(self.ids):])
        self.references = [[next(it) for _ in refs] for refs in self.raw_references]

    @cached_property
    def batch(self) -> EvalBatch:
        return EvalBatch([c.split() for c in self.candidates], [[r.split() for r in refs] for refs in self.references])


def _tokenizer(name: str) -> Callable[[list[str]], list[str]]:
    if name == "python":
        return lambda texts: [ptb_tokenize(t) for t in texts]
    if name == "java":
        from rewards.ptb_java import java_ptb_tokenize

        return java_ptb_tokenize
    raise ConfigError(f"unknown tokenizer {name!r}; use 'python' or 'java'")


@dataclass
class MetricOutput:
    corpus: dict[str, float]
    per_item: dict[str, list[float]]


class Metric(Protocol):
    def compute(self, data: ScoringData) -> MetricOutput: ...


@dataclass(eq=False)  # hashable by identity: one family, one spec
class MetricSpec:
    names: tuple[str, ...]
    factory: Callable[..., Metric]  # (context) or, with wants_names, (context, requested names)
    unavailable: Callable[[MetricContext], str | None] = lambda ctx: None
    in_all: bool = True  # part of "all"
    wants_names: bool = False  # the family computes only the names asked for

    def build(self, context: MetricContext, requested: Sequence[str]) -> Metric:
        if self.wants_names:
            return self.factory(context, [n for n in self.names if n in requested])
        return self.factory(context)


_REGISTRY: dict[str, MetricSpec] = {}


def register_metric(spec: MetricSpec) -> None:
    for name in spec.names:
        if name in _REGISTRY and _REGISTRY[name] is not spec:
            raise ValueError(f"metric {name!r} registered twice")
        _REGISTRY[name] = spec


def available_metrics() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def resolve_names(names: str | Sequence[str]) -> list[str]:
    _load_builtin()
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if list(names) == ["all"]:
        return [n for n in _REGISTRY if _REGISTRY[n].in_all]
    unknown = [n for n in names if n not in _REGISTRY]
    if unknown:
        raise ConfigError(f"unknown metric {unknown[0]!r}; known metrics: {', '.join(sorted(_REGISTRY))}")
    return list(dict.fromkeys(names))


@dataclass
class SuiteResult:
    corpus: dict[str, float]
    per_item: dict[str, dict[int, float]]
    skipped: dict[str, str]

    def to_json(self) -> dict:
        return {"corpus": self.corpus,
                "per_item": {m: {str(i): v for i, v in items.items()} for m, items in self.per_item.items()},
                "skipped": self.skipped}


class MetricSuite:
    """Metrics by name; each family is built once and reused across calls (METEOR's Java
    process lives as long as the suite)."""

    def __init__(self, names: str | Sequence[str] = "all", context: MetricContext | None = None):
        self.context = context or MetricContext()
        self.names = resolve_names(names)
        self.skipped: dict[str, str] = {}
        self._families: list[tuple[MetricSpec, Metric]] = []
        for spec in dict.fromkeys(_REGISTRY[n] for n in self.names):
            reason = spec.unavailable(self.context)
            if reason:
                self.skipped.update({n: reason for n in spec.names if n in self.names})
            else:
                self._families.append((spec, spec.build(self.context, self.names)))

    def score(self, predictions: Mapping[int, str], references: Mapping[int, Sequence[str]]) -> SuiteResult:
        ids = list(predictions)
        missing = [i for i in ids if i not in references]
        if missing:
            raise RlcapError(f"{len(missing)} prediction id(s) have no references, e.g. {missing[:5]}")
        corpus, rows = self._compute(ScoringData(ids, [predictions[i] for i in ids], [references[i] for i in ids],
                                                 self.context.tokenizer))
        per_item = {name: {i: v for i, v in zip(ids, values, strict=True)} for name, values in rows.items()}
        return SuiteResult(corpus, per_item, dict(self.skipped))

    def score_rows(self, image_ids: Sequence[int], captions: Sequence[str],
                   references: Sequence[Sequence[str]]) -> dict[str, list[float]]:
        """Per-row scores where rows may share an image (foils, candidate pairs, rated captions).
        Corpus-level statistics (CIDEr's document frequencies) come from all rows together."""
        _, rows = self._compute(ScoringData(image_ids, captions, references, self.context.tokenizer))
        return rows

    def _compute(self, data: ScoringData) -> tuple[dict[str, float], dict[str, list[float]]]:
        corpus: dict[str, float] = {}
        rows: dict[str, list[float]] = {}
        for spec, metric in self._families:
            out = metric.compute(data)
            for name in spec.names:
                if name in self.names and name in out.corpus:
                    corpus[name] = float(out.corpus[name])
                    if name in out.per_item:
                        rows[name] = [float(v) for v in out.per_item[name]]
        return corpus, rows

    def close(self) -> None:
        for _, metric in self._families:
            close = getattr(metric, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def mean_output(name: str, values: np.ndarray) -> MetricOutput:
    return MetricOutput({name: float(np.mean(values)) if len(values) else 0.0}, {name: [float(v) for v in values]})


def _load_builtin() -> None:
    import rewards.clip_rewards
    import rewards.ngram_metrics  # noqa: F401  (registers the n-gram metrics and diagnostics)
