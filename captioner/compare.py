"""`python -m captioner.compare --runs A,B,C [--metrics cider,object_recall] [--epoch last|best --by specs]`

Runs side by side: one row per run at its last epoch (or its best by a metric), after a row for the
checkpoint the first run started from (`scst.init_from`, scored with that run's metrics on its val split
and cached in its start.json, as captioner.report does), so each change is read against the same start.
Only val metrics every chosen record holds are shown unless --metrics names them; a run with no finished
epoch, or a metric no run holds, is an error naming it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from captioner.report import load_run_config
from captioner.run_log import read_metrics
from captioner.select import best_epoch, metric_columns
from captioner.start import score_start
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option
from plumbing.errors import ConfigError, DataError
from plumbing.tables import format_table

NOT_SHOWN = {"epoch", "step", "seconds", "train_loss", "val_loss"}


@dataclass
class CompareConfig:
    runs: str = option("", help="captioner.train run folders, a comma list (repeatable)", comma_list=True)
    metrics: str | None = option(None, help="columns, a comma list (default: every val metric all rows hold)",
                                 comma_list=True)
    epoch: Literal["last", "best"] = option("last", help="each run's last epoch, or its best by --by")
    by: str = option("specs", help="with --epoch best: the metric that picks each run's epoch")
    start: bool = option(True, help="the first row: the first run's starting checkpoint (scst.init_from), read "
                         "from its start.json or scored once and cached there")
    markdown: bool = option(False, help="a markdown table (for docs) instead of aligned text")


def chosen_record(run: Path, epoch: str, by: str) -> dict:
    records = [r for r in read_metrics(run) if "epoch" in r]
    if not records:
        raise DataError(f"{run}: no finished epoch in metrics.jsonl")
    return best_epoch(records, by) if epoch == "best" else records[-1]


def start_record(run: Path) -> dict | None:
    """The starting checkpoint's val metrics: start.json as it is when the run has no config (a copied
    folder), else scored for the run's config (captioner.start re-scores a start.json of another start)."""
    path = run / "start.json"
    if (run / "config.yaml").is_file():
        cfg = load_run_config(run)
        start = score_start(cfg, path) if cfg.scst.init_from else None
    elif path.is_file():
        try:
            start = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DataError(f"{path}: unreadable ({exc})") from None
    else:
        start = None
    return None if start is None else {k: v for k, v in start.items() if isinstance(v, float)}


def comparison_rows(runs: Sequence[Path], epoch: str, by: str, with_start: bool) -> list[tuple[str, dict]]:
    rows = [(f"{run.name} (epoch {rec['epoch']})", rec) for run in runs
            for rec in [chosen_record(run, epoch, by)]]
    start = start_record(runs[0]) if with_start else None
    return ([("start", start)] if start else []) + rows


def columns_of(rows: list[tuple[str, dict]], wanted: list[str] | None) -> list[str]:
    if wanted:
        unknown = [m for m in wanted if not any(m in rec for _, rec in rows)]
        if unknown:
            raise ConfigError(f"--metrics: no run holds {unknown}")
        return wanted
    shared = [c for c in metric_columns([rec for _, rec in rows[-1:]]) if c not in NOT_SHOWN]
    return [c for c in shared if all(c in rec for _, rec in rows)]


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(CompareConfig, "python -m captioner.compare", __doc__)
    cfg, _ = parse_config(CompareConfig, parser, argv)
    runs = [Path(r) for r in cfg.runs.split(",") if r]
    if not runs:
        raise ConfigError("compare needs --runs DIR[,DIR...]")
    for run in runs:
        if not (run / "metrics.jsonl").is_file():
            raise DataError(f"{run}: not a run folder (no metrics.jsonl)")
    rows = comparison_rows(runs, cfg.epoch, cfg.by, cfg.start)
    wanted = [m for m in (cfg.metrics or "").split(",") if m]
    columns = columns_of(rows, wanted)
    print(format_table(["run", *columns], [[name, *(rec.get(c) for c in columns)] for name, rec in rows],
                       markdown=cfg.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
