"""A sweep's summary: each run at its best epoch, as markdown, CSV, a PNG against α and
tensorboard hparams (the shape of Table VI in the L-CLIPScore paper). A sweep over seeds gives per α
the mean over its seeds with the 95% interval of that mean, and picks the α by that mean."""

from __future__ import annotations

import csv
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

from captioner.plots import plot_panels
from captioner.seed_groups import AlphaGroup, best_group, best_seed, format_groups, format_seed_runs, group_runs
from captioner.select import TRAINING_ONLY, Selection, metric_columns, select_across
from plumbing.atomic import write_text
from plumbing.errors import DataError
from plumbing.tables import format_table, format_value


@dataclass
class SweepPoint:
    alpha: float
    run: Path
    status: str  # trained | skipped | summary-only
    seconds: float
    seed: int | None = None  # the run's seed where the sweep has a seed list


@dataclass
class Summary:
    markdown: str
    markdown_path: Path
    csv_path: Path
    plot_path: Path
    best: Selection  # the best run (with seeds: the chosen α's best seed)
    best_text: str   # what was chosen, for the console


def summary_rows(points: list[SweepPoint], by: str,
                 mode: str | None) -> tuple[list[tuple[float, Selection]], Selection]:
    """Each point's run at its best epoch, and the best of them."""
    missing = [p.run for p in points if not (p.run / "metrics.jsonl").exists()]
    if missing:
        raise DataError(f"no metrics yet for {', '.join(map(str, missing))}: run the sweep (without "
                        f"--summary-only) to train them")
    best, per_run = select_across([p.run for p in points], by, mode)
    return [(p.alpha, s) for p, s in zip(points, per_run, strict=True)], best


def as_markdown(rows: list[tuple[float, Selection]], columns: list[str], by: str, rewards: tuple[str, str],
                start: dict) -> str:
    body = [["start", "—"] + [format_value(start.get(c, "")) for c in columns]]
    body += [[f"{alpha:g}", str(s.record["epoch"])] + [format_value(s.record.get(c)) for c in columns]
             for alpha, s in rows]
    head = (f"α sweep: reward = α·{rewards[0]} + (1−α)·{rewards[1]}; each run at its best epoch by {by}. "
            f"Row `start`: the shared starting checkpoint `{start.get('checkpoint')}`, scored the same way.\n\n")
    return head + format_table(["α", "epoch", *columns], body, markdown=True) + "\n"


def as_csv(rows: list[tuple[float, Selection]], columns: list[str], start: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["alpha", "run", "epoch", *columns])
    writer.writerow(["start", start.get("checkpoint", ""), "", *(start.get(c, "") for c in columns)])
    for alpha, s in rows:
        writer.writerow([alpha, s.run.name, s.record["epoch"], *(s.record.get(c, "") for c in columns)])
    return out.getvalue()


def write_hparams(sweep: Path, rows: list[tuple[float, Selection]], columns: list[str],
                  rewards: tuple[str, str]) -> None:
    """One hparams entry per run; rewritten from scratch so that re-runs leave no duplicates."""
    from torch.utils.tensorboard import SummaryWriter

    root = sweep / "tensorboard"
    shutil.rmtree(root, ignore_errors=True)
    for alpha, s in rows:
        with SummaryWriter(str(root / s.run.name)) as writer:
            hparams = {"alpha": alpha, "reward_a": rewards[0], "reward_b": rewards[1], "epoch": s.record["epoch"]}
            metrics = {f"hparam/{c}": float(s.record[c]) for c in columns if isinstance(s.record.get(c), float)}
            writer.add_hparams(hparams, metrics, run_name=".")


def write_summary(sweep: Path, points: list[SweepPoint], by: str, mode: str | None,
                  rewards: tuple[str, str], start: dict) -> Summary:
    """`start`: the starting checkpoint's metrics (a first row, and a dashed line in each panel)."""
    if any(p.seed is not None for p in points):
        return _write_seeded(sweep, points, by, mode, rewards, start)
    rows, best = summary_rows(points, by, mode)
    columns = metric_columns([s.record for _, s in rows])
    markdown = as_markdown(rows, columns, by, rewards, start)
    md_path, csv_path = sweep / "summary.md", sweep / "summary.csv"
    write_text(md_path, markdown)
    write_text(csv_path, as_csv(rows, columns, start))
    alphas = [alpha for alpha, _ in rows]
    series = {c: (alphas, [float(s.record.get(c, float("nan"))) for _, s in rows])
              for c in columns if c not in TRAINING_ONLY}
    plot_path = plot_panels(series, "α", sweep / "alpha_metrics.png",
                            title=f"α·{rewards[0]} + (1−α)·{rewards[1]} (best epoch by {by}; dashed: start)",
                            baselines={c: v for c, v in start.items() if isinstance(v, float)})
    write_hparams(sweep, rows, columns, rewards)
    text = f"{best.run} epoch {best.record['epoch']} ({best.record[by]:.4f})"
    return Summary(markdown, md_path, csv_path, plot_path, best, text)


def _write_seeded(sweep: Path, points: list[SweepPoint], by: str, mode: str | None,
                  rewards: tuple[str, str], start: dict) -> Summary:
    rows, _ = summary_rows(points, by, mode)
    groups = group_runs([(p.alpha, p.seed, s) for p, (_, s) in zip(points, rows, strict=True)])
    chosen = best_group(groups, by, mode)
    columns = metric_columns([s.record for _, s in rows])
    markdown = (f"α sweep over seeds: reward = α·{rewards[0]} + (1−α)·{rewards[1]}; each run at its best epoch by "
                f"{by}, then per α the mean over its seeds and the 95% interval of that mean (Student's t). "
                f"Row `start`: the shared starting checkpoint `{start.get('checkpoint')}`. `*`: the α chosen by "
                f"its mean {by}.\n\n" + format_groups(groups, columns, chosen, start, markdown=True)
                + "\n\nEvery run:\n\n" + format_seed_runs(groups, columns, markdown=True) + "\n")
    md_path, csv_path = sweep / "summary.md", sweep / "summary.csv"
    write_text(md_path, markdown)
    write_text(csv_path, _seeded_csv(groups, columns, start))
    series, errors = {}, {}
    for c in (c for c in columns if c not in TRAINING_ONLY):
        scored = [(g.alpha, g.interval(c)) for g in groups if g.values(c)]
        series[c] = ([a for a, _ in scored], [i.mean for _, i in scored])
        errors[c] = ([i.low for _, i in scored], [i.high for _, i in scored])
    plot_path = plot_panels(series, "α", sweep / "alpha_metrics.png", errors=errors,
                            title=f"α·{rewards[0]} + (1−α)·{rewards[1]}: mean over seeds, 95% interval "
                                  f"(best epoch by {by}; dashed: start)",
                            baselines={c: v for c, v in start.items() if isinstance(v, float)})
    write_hparams(sweep, [(g.alpha, s) for g in groups for s in g.runs], columns, rewards)
    mean = chosen.interval(by)
    text = (f"α = {chosen.alpha:g}, {by} {mean.text()} over seeds {chosen.seeds}; its best seed's checkpoint: "
            f"{best_seed(chosen, by, mode).run}")
    return Summary(markdown, md_path, csv_path, plot_path, best_seed(chosen, by, mode), text)


def _seeded_csv(groups: list[AlphaGroup], columns: list[str], start: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["alpha", "seed", "run", "epoch", "statistic", *columns])
    writer.writerow(["start", "", start.get("checkpoint", ""), "", "value", *(start.get(c, "") for c in columns)])
    for group in groups:
        for seed, s in zip(group.seeds, group.runs, strict=True):
            writer.writerow([group.alpha, seed, s.run.name, s.record["epoch"], "value",
                             *(s.record.get(c, "") for c in columns)])
        for statistic in ("mean", "low", "high"):
            cells = [getattr(group.interval(c), statistic) if group.values(c) else "" for c in columns]
            writer.writerow([group.alpha, "", "", "", statistic, *cells])
    return out.getvalue()
