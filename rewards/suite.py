"""The metric suite: any subset of metrics by name, corpus and per-item scores, one registry.

A metric family registers once with the names it produces, a factory that receives the
ScoringContext and, per name, whether higher is better (as torchmetrics' `higher_is_better`;
None for a diagnostic with no better direction, such as the mean length). Later families (the
CLIP-family scores) join the same registry with `register_metric`, with no change here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, Self

import numpy as np

from plumbing.errors import ConfigError, RlcapError
from plumbing.ptb import ptb_tokenize
from plumbing.tables import format_table
from rewards.context import ScoringContext
from rewards.text.batch import EvalBatch


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
        from plumbing.ptb_java import java_ptb_tokenize

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
    unavailable: Callable[[ScoringContext], str | None] = lambda ctx: None
    in_all: bool = True  # part of "all"
    wants_names: bool = False  # the family computes only the names asked for
    lower_is_better: frozenset[str] = frozenset()  # the family's names where lower is better
    external: bool = False  # runs an outside program (Java): a failure skips it for that call, with the reason
    reference_free: frozenset[str] = frozenset()  # the family's names computed without reference captions
    no_direction: frozenset[str] = frozenset()  # diagnostics with no better direction

    def higher_is_better(self, name: str) -> bool | None:
        if name in self.no_direction:
            return None
        return name not in self.lower_is_better

    def build(self, context: ScoringContext, requested: Sequence[str]) -> Metric:
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


def higher_is_better(name: str) -> bool | None:
    """Whether a higher value of metric `name` is better (None: no better direction)."""
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown metric {name!r}; known metrics: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name].higher_is_better(name)


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

    def table(self) -> str:
        """Corpus values and skipped metrics with their reasons, as an aligned text table."""
        rows = [[name, value] for name, value in self.corpus.items()]
        rows += [[name, f"skipped: {reason}"] for name, reason in self.skipped.items()]
        return format_table(["metric", "value"], rows)


class MetricSuite:
    """Metrics by name; each family is built once and reused across calls (METEOR's Java
    process lives as long as the suite)."""

    def __init__(self, names: str | Sequence[str] = "all", context: ScoringContext | None = None,
                 references: bool = True):
        """`references=False`: captions come without references, so only reference-free metrics run."""
        self.context = context if context is not None else ScoringContext()
        self.names = resolve_names(names)
        self.references = references
        self.skipped: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        self._families: list[tuple[MetricSpec, Metric]] = []
        if not references:
            self.skipped = {n: "needs reference captions (--references)" for n in self.names
                            if n not in _REGISTRY[n].reference_free}
            self.names = [n for n in self.names if n not in self.skipped]
        for spec in dict.fromkeys(_REGISTRY[n] for n in self.names):
            reason = spec.unavailable(self.context)
            if reason:
                self.skipped.update({n: reason for n in spec.names if n in self.names})
            else:
                self._families.append((spec, spec.build(self.context, self.names)))

    def score(self, predictions: Mapping[int, str], references: Mapping[int, Sequence[str]]) -> SuiteResult:
        ids = list(predictions)
        missing = [i for i in ids if i not in references] if self.references else []
        if missing:
            raise RlcapError(f"{len(missing)} prediction id(s) have no references, e.g. {missing[:5]}")
        refs = [references.get(i, []) for i in ids]
        corpus, rows = self._compute(ScoringData(ids, [predictions[i] for i in ids], refs, self.context.tokenizer))
        per_item = {name: {i: v for i, v in zip(ids, values, strict=True)} for name, values in rows.items()}
        return SuiteResult(corpus, per_item, {**self.skipped, **self.failures})

    def score_rows(self, image_ids: Sequence[int], captions: Sequence[str],
                   references: Sequence[Sequence[str]]) -> dict[str, list[float]]:
        """Per-row scores where rows may share an image (foils, candidate pairs, rated captions).
        Corpus-level statistics (CIDEr's document frequencies) come from all rows together."""
        _, rows = self._compute(ScoringData(image_ids, captions, references, self.context.tokenizer))
        return rows

    def _compute(self, data: ScoringData) -> tuple[dict[str, float], dict[str, list[float]]]:
        corpus: dict[str, float] = {}
        rows: dict[str, list[float]] = {}
        self.failures = {}  # external metrics that failed in this call, with the reason
        for spec, metric in self._families:
            try:
                out = metric.compute(data)
            except (RlcapError, OSError, ValueError, subprocess.SubprocessError) as exc:
                if not spec.external:
                    raise
                self.failures.update({n: f"failed: {exc}" for n in spec.names if n in self.names})
                continue
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
    import rewards.clip.terms
    import rewards.diagnostics.terms
    import rewards.text.terms  # noqa: F401  (each registers its family's metrics)
