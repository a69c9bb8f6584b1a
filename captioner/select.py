"""`python -m captioner.select --run DIR --by <metric>` or `--sweep DIR`: the best epoch of a run,
or the best run and epoch of a sweep, by any metric in metrics.jsonl, with the tables behind it.
A sweep over seeds (runs `alpha_<α>_seed_<s>`) picks the α by its mean over the seeds, each seed's run
at its own best epoch, and adds the selection regret of SPECS, CIDEr and CLIP-S (selection_regret)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from captioner.run_log import read_metrics
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option
from plumbing.errors import ConfigError, DataError
from plumbing.tables import format_table, format_value
from rewards import higher_is_better

LOSSES = frozenset({"val_loss", "train_loss"})  # the trainer's own losses, logged beside the metrics
NOT_METRICS = {"epoch", "step", "seconds"}
TRAINING_ONLY = {"train_loss"}  # logged per epoch, but not a val metric worth a curve


def metric_mode(by: str, mode: str | None = None) -> str:
    """`mode` when it is max or min; else a loss is minimised and a metric follows its own
    direction (the metric suite's `higher_is_better`)."""
    if mode in ("max", "min"):
        return mode
    if by in LOSSES:
        return "min"
    higher = higher_is_better(by)
    if higher is None:
        raise ConfigError(f"metric {by!r} has no better direction (higher or lower); say which with --mode "
                          "(or eval.select_mode)")
    return "max" if higher else "min"


def best_epoch(records: list[dict], by: str, mode: str | None = None) -> dict:
    usable = [r for r in records if isinstance(r.get(by), (int, float))]
    if not usable:
        known = sorted({k for r in records for k, v in r.items() if isinstance(v, (int, float))})
        raise DataError(f"no epoch has metric {by!r}; metrics in this run: {', '.join(known)}")
    return (min if metric_mode(by, mode) == "min" else max)(usable, key=lambda r: r[by])


def metric_columns(records: list[dict]) -> list[str]:
    """Numeric columns in first-seen order (the order the suite wrote them)."""
    columns: dict[str, None] = {}
    for record in records:
        columns.update({k: None for k, v in record.items() if isinstance(v, float) and k not in NOT_METRICS})
    return list(columns)


def format_epochs(records: list[dict], columns: list[str], marked: int | None) -> str:
    rows = [[str(r["epoch"]) + (" *" if r["epoch"] == marked else "")] + [format_value(r.get(c)) for c in columns]
            for r in records]
    return format_table(["epoch", *columns], rows)


@dataclass
class Selection:
    run: Path
    record: dict  # the chosen epoch's metrics.jsonl line

    @property
    def checkpoint(self) -> Path | None:
        path = self.run / "checkpoints" / f"epoch_{self.record['epoch']}"
        return path if path.exists() else None


def select_epoch(run: Path, by: str, mode: str | None = None, records: list[dict] | None = None) -> Selection:
    """The run's best epoch by `by`; pass `records` when metrics.jsonl was already read."""
    records = read_metrics(run) if records is None else records
    if not records:
        raise DataError(f"{run}: no metrics.jsonl (or it is empty)")
    return Selection(run, best_epoch(records, by, mode))


def sweep_runs(sweep: Path) -> list[Path]:
    """The run directories of a sweep: its subfolders that hold a metrics.jsonl."""
    if not sweep.is_dir():
        raise DataError(f"{sweep}: no such sweep directory")
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "metrics.jsonl").exists())
    if not runs:
        raise DataError(f"{sweep}: no run folder with a metrics.jsonl inside")
    return runs


def select_across(runs: Sequence[Path], by: str, mode: str | None = None) -> tuple[Selection, list[Selection]]:
    """Each run's best epoch, and the best of those."""
    per_run = [select_epoch(run, by, mode) for run in runs]
    pick = min if metric_mode(by, mode) == "min" else max
    return pick(per_run, key=lambda s: s.record[by]), per_run


def _report_run(run: Path, by: str, mode: str | None) -> Selection:
    records = read_metrics(run)
    chosen = select_epoch(run, by, mode, records)
    print(format_epochs(records, metric_columns(records), chosen.record["epoch"]))
    return chosen


def _report_sweep(sweep: Path, by: str, mode: str | None) -> tuple[Selection, list[Selection]]:
    chosen, per_run = select_across(sweep_runs(sweep), by, mode)
    columns = metric_columns([s.record for s in per_run])
    rows = [[s.run.name + (" *" if s is chosen else ""), str(s.record["epoch"])]
            + [format_value(s.record.get(c)) for c in columns] for s in per_run]
    print(f"each run at its best epoch by {by}:")
    print(format_table(["run", "epoch", *columns], rows))
    print(f"\nfull metric row of {chosen.run.name}, epoch {chosen.record['epoch']}:")
    print("\n".join(f"  {c}: {format_value(chosen.record[c])}" for c in columns if c in chosen.record))
    return chosen, per_run


@dataclass
class SelectConfig:
    run: str | None = option(None, help="a run directory (holds metrics.jsonl)")
    sweep: str | None = option(None, help="a sweep directory (captioner.sweep): one run folder per point")
    by: str | None = option(None, help="metric to select by (default: cider for --run, specs for --sweep)")
    mode: Literal["auto", "max", "min"] = option("auto", help="auto: the metric's own direction (losses: min)")
    paired: bool = option(False, help="with --sweep: score every run's chosen epoch's val captions per image with the "
                          "chosen run's metric, and give each run's difference to the chosen one with a 95%% bootstrap "
                          "interval and an exact sign test over the images (captioner/paired_runs.py): whether the "
                          "choice is more than these images' chance; for a sweep over seeds, every α against "
                          "the chosen one (or --against) on recall, hallucination, CIDEr and SPECS, per image "
                          "pooled over seeds and paired by seed (captioner/paired_seeds.py)")
    against: float | None = option(None, help="with --paired on a sweep over seeds: compare every α with this α "
                                   "(e.g. 0, CIDEr-D alone) instead of the chosen one")


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(SelectConfig, "python -m captioner.select", __doc__)
    cfg, _ = parse_config(SelectConfig, parser, argv)
    if bool(cfg.run) == bool(cfg.sweep):
        raise ConfigError("select needs exactly one of --run DIR and --sweep DIR")
    by = cfg.by or ("cider" if cfg.run else "specs")
    mode = None if cfg.mode == "auto" else cfg.mode
    if cfg.paired and not cfg.sweep:
        raise ConfigError("--paired compares the runs of a sweep; give --sweep DIR")
    if cfg.sweep and _seeded(sweep_runs(Path(cfg.sweep))):
        from captioner import seeded_select  # it builds on this module

        return seeded_select.report(Path(cfg.sweep), by, mode, cfg.paired, cfg.against)
    if cfg.against is not None:
        raise ConfigError("--against names the α that --paired compares with, in a sweep over seeds")
    paired: list[dict] | None = None
    if cfg.run:
        chosen = _report_run(Path(cfg.run), by, mode)
    else:
        chosen, per_run = _report_sweep(Path(cfg.sweep), by, mode)
        if cfg.paired:
            from captioner import paired_runs  # it reads runs through captioner.report, which imports this module

            compared = paired_runs.paired_runs(chosen, [s for s in per_run if s is not chosen], by, mode)
            print("\n" + paired_runs.format_paired(chosen, compared, by) + "\n")
            paired = paired_runs.paired_records(compared)
    ckpt = chosen.checkpoint
    print(f"best by {by}: {chosen.run} epoch {chosen.record['epoch']} ({chosen.record[by]:.4f})"
          + (f"; checkpoint {ckpt}" if ckpt else "; its checkpoint was pruned"))
    print(json.dumps({"run": str(chosen.run), "by": by, "epoch": chosen.record["epoch"], "value": chosen.record[by],
                      "checkpoint": str(ckpt) if ckpt else None,
                      "metrics": {c: chosen.record[c] for c in metric_columns([chosen.record])},
                      **({"paired": paired} if paired is not None else {})}))
    return 0


def _seeded(runs: list[Path]) -> bool:
    """Whether the sweep's runs are named by α and seed (alpha_<α>_seed_<s>)."""
    return any(re.search(r"_seed_-?\d+$", run.name) for run in runs)


if __name__ == "__main__":
    raise SystemExit(main())
