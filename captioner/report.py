"""`python -m captioner.report --run DIR [--by METRIC] [--samples 8]`

Writes DIR/report.md, a page a person reads at a glance: the selected checkpoint and the metric
it was chosen by, the per-epoch metric table, test-split scores when `captioner.evaluate` left
them, metric and training-reward curves (PNG beside the report), sample captions of the chosen
epoch with the score of every reward that can be built for the run, and the resolved config.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from captioner.plots import plot_panels
from captioner.run_log import read_metrics
from captioner.select import TRAINING_ONLY, Selection, metric_columns, metric_mode, select_epoch
from captioner.start import score_start
from captioner.train_config import TrainConfig, scoring_context
from plumbing.atomic import write_text
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import load_config, option, require_keys
from plumbing.device import pick_device
from plumbing.errors import DataError, RlcapError
from plumbing.tables import format_table, format_value
from rewards import ScoringContext, available_rewards, make_reward

# `constant` exists to test the bank; it says nothing about a caption.
NOT_REPORTED_REWARDS = {"constant"}


def load_run_config(run: Path) -> TrainConfig:
    path = run / "config.yaml"
    if not path.exists():
        raise DataError(f"{run}: no config.yaml; is this a captioner.train run folder?")
    return load_config(TrainConfig, path)


def reward_scores(cfg: TrainConfig, image_ids: list[int], captions: list[str],
                  context: ScoringContext) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Every reward the run's context can build, scored on the given captions; and why others could not."""
    scores, skipped = {}, {}
    for name in available_rewards():
        if name in NOT_REPORTED_REWARDS:
            continue
        try:
            reward = make_reward(name, context)
        except (RlcapError, FileNotFoundError) as exc:
            skipped[name] = str(exc).splitlines()[0]
            continue
        scores[name] = [float(v) for v in reward(captions, image_ids)]
    return scores, skipped


def read_samples(run: Path, epoch: int) -> dict[int, str]:
    path = run / "samples" / f"epoch_{epoch}.json"
    if not path.exists():
        raise DataError(f"{path}: missing; the run's samples of epoch {epoch} are needed for the report")
    return {int(r["image_id"]): r["caption"] for r in json.loads(path.read_text())}


def training_scalars(run: Path, prefix: str = "train/reward/") -> dict[str, tuple[list[float], list[float]]]:
    """Per-step mean rewards from the run's tensorboard events (the last value wins per step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = run / "tensorboard"
    if not root.exists():
        return {}
    events = EventAccumulator(str(root), size_guidance={"scalars": 0}).Reload()
    wanted = [t for t in events.Tags()["scalars"] if t.startswith(prefix) and t.endswith(("/mean", "/total"))]
    series = {}
    for tag in sorted(wanted):
        by_step = {e.step: e.value for e in events.Scalars(tag)}
        steps = sorted(by_step)
        series[tag.removeprefix(prefix).removesuffix("/mean")] = (steps, [by_step[s] for s in steps])
    return series


def write_curves(run: Path, records: list[dict], columns: list[str]) -> list[Path]:
    epochs = [r["epoch"] for r in records]
    metric_series = {c: (epochs, [float(r.get(c, float("nan"))) for r in records]) for c in columns}
    paths = [plot_panels(metric_series, "epoch", run / "report_metrics.png", title=f"{run.name}: val metrics")]
    reward_series = training_scalars(run)
    if reward_series:
        paths.append(plot_panels(reward_series, "optimizer step", run / "report_rewards.png",
                                 title=f"{run.name}: training rewards (mean over samples)"))
    return paths


def sample_section(cfg: TrainConfig, run: Path, epoch: int, count: int) -> str:
    captions = read_samples(run, epoch)
    image_ids = sorted(captions)[:count]
    context = scoring_context(cfg, str(pick_device("auto")))
    references = context.references
    texts = [captions[i] for i in image_ids]
    scores, skipped = reward_scores(cfg, image_ids, texts, context)
    names = list(scores)
    rows = [[str(i), texts[k], *(f"{scores[n][k]:.3f}" for n in names), (references.get(i) or [""])[0]]
            for k, i in enumerate(image_ids)]
    text = [f"Val captions of epoch {epoch}, each scored by every reward that can be built for this run.\n",
            format_table(["image", "caption", *names, "a reference"], rows, markdown=True)]
    if skipped:
        text.append("\nRewards not scored: " + "; ".join(f"`{n}` ({why})" for n, why in skipped.items()))
    return "\n".join(text)


def epoch_table(records: list[dict], columns: list[str], chosen: int) -> str:
    rows = [[str(r["epoch"]) + (" ←" if r["epoch"] == chosen else ""), str(r.get("stage", "")),
             *(format_value(r.get(c)) for c in columns)] for r in records]
    return format_table(["epoch", "stage", *columns], rows, markdown=True)


def test_section(run: Path) -> str | None:
    scores = run / "test_results.scores.json"
    if not scores.exists():
        return None
    corpus = json.loads(scores.read_text())["corpus"]
    return (f"From `{scores}` (`captioner.evaluate` on the test split).\n\n"
            + format_table(list(corpus), [[format_value(v) for v in corpus.values()]], markdown=True))


def selection_line(chosen: Selection, by: str, mode: str) -> str:
    ckpt = chosen.checkpoint
    where = f"`{ckpt}`" if ckpt else "its checkpoint was pruned (keep_last)"
    return (f"Chosen by **{by}** ({mode}): epoch {chosen.record['epoch']}, {by} = "
            f"{format_value(chosen.record[by])}; checkpoint {where}.")


def run_line(run: Path, records: list[dict], cfg: TrainConfig) -> str:
    stage = records[-1].get("stage", "?")
    rewards = cfg.scst.rewards if stage == "scst" else "none (XE)"
    return f"Run folder `{run}`; {len(records)} epoch(s), stage {stage}; rewards {rewards}.\n"


GROUNDING = ("object_recall", "hallucination_mention", "hallucination_caption")
VERDICT = (("object_recall", "object recall", True), ("hallucination_mention", "mention hallucination", False),
           ("cider", "CIDEr", True))


def start_section(cfg: TrainConfig, run: Path, chosen: Selection) -> str:
    """Grounding and CIDEr of the chosen checkpoint beside its starting checkpoint's, a verdict, and
    a grid of val images with both captions."""
    start = score_start(cfg, run / "start.json")
    names = [n for n in ("cider", *GROUNDING) if n in start and n in chosen.record]
    rows = [["start (" + str(cfg.scst.init_from) + ")", *(start[n] for n in names)],
            [f"chosen (epoch {chosen.record['epoch']})", *(chosen.record[n] for n in names)],
            ["change", *(f"{chosen.record[n] - start[n]:+.4f}" for n in names)]]
    lines = [format_table(["", *names], rows, markdown=True), "", verdict(start, chosen.record)]
    grid = image_grid(cfg, run, start["captions"], read_samples(run, chosen.record["epoch"]))
    if grid is not None:
        lines += ["", f"![start and chosen captions]({grid.name})"]
    return "\n".join(lines)


def verdict(start: dict, end: dict) -> str:
    """One line: is the chosen checkpoint better than its start on grounding and CIDEr?"""
    said, better = [], []
    for key, label, higher in VERDICT:
        if key not in start or key not in end:
            continue
        change = end[key] - start[key]
        relative = change / start[key] if start[key] else 0.0
        said.append(f"{label} {start[key]:.3f} -> {end[key]:.3f} ({relative:+.0%})")
        better.append(change > 0 if higher else change < 0)
    if not said:
        return "No grounding metrics in this run (add object_recall, hallucination_mention to eval.metrics)."
    outcome = "better than its start on all of them" if all(better) else "not better than its start on all of them"
    return f"Against its start: {'; '.join(said)}: {outcome}."


def image_grid(cfg: TrainConfig, run: Path, start: dict, chosen: dict[int, str], count: int = 8) -> Path | None:
    """A PNG of the first val images with the start's and the chosen checkpoint's captions, when the
    images can be found (the features' extraction config names the dataset and images root)."""
    from captioner.plots import contact_sheet
    from features.extract import ExtractConfig
    from features.images import resolve_image_path
    from plumbing.karpathy import load_dataset

    made = Path(cfg.data.feats).with_suffix(".config.yaml")
    if not made.exists():
        return None
    extract = load_config(ExtractConfig, made)
    entries = {e.image_id: e for e in load_dataset(extract.dataset)}
    ids = [i for i in sorted(chosen) if str(i) in start and i in entries][:count]
    paths = [resolve_image_path(extract.images_root, entries[i], extract.allow_outside_root) for i in ids]
    return contact_sheet(paths, [[start[str(i)], chosen[i]] for i in ids], run / "report_captions.png",
                         labels=["start", "chosen"]) if ids else None


def build_report(run: Path, by: str | None, samples: int) -> Path:
    cfg = load_run_config(run)
    records = read_metrics(run)
    by = by or cfg.eval.select_by
    mode = metric_mode(by, None if by != cfg.eval.select_by else cfg.eval.select_mode)
    chosen = select_epoch(run, by, mode, records)
    columns = metric_columns(records)
    figures = write_curves(run, records, [c for c in columns if c not in TRAINING_ONLY])
    parts = [f"# Run report: {run.name}\n",
             run_line(run, records, cfg),
             "## Selected checkpoint\n", selection_line(chosen, by, mode) + "\n",
             "## Per-epoch metrics (val)\n", epoch_table(records, columns, chosen.record["epoch"]) + "\n"]
    test = test_section(run)
    if test:
        parts += ["## Test split\n", test + "\n"]
    parts += ["## Curves\n", *(f"![{p.stem}]({p.name})\n" for p in figures)]
    if cfg.scst.init_from:
        parts += ["## Against the start\n", start_section(cfg, run, chosen) + "\n"]
    parts += ["## Sample captions and their rewards\n",
              sample_section(cfg, run, chosen.record["epoch"], samples) + "\n"]
    parts += ["## Resolved config\n", "```yaml\n" + (run / "config.yaml").read_text().rstrip() + "\n```\n"]
    path = run / "report.md"
    write_text(path, "\n".join(parts))
    return path


@dataclass
class ReportConfig:
    run: str = option("", help="a captioner.train run folder")
    by: str | None = option(None, help="metric that picks the checkpoint (default: the run's eval.select_by)")
    samples: int = option(8, help="sample captions shown with their rewards", at_least=0)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(ReportConfig, "python -m captioner.report", __doc__)
    cfg, _ = parse_config(ReportConfig, parser, argv)
    require_keys(cfg, ("run",), "report")
    path = build_report(Path(cfg.run), cfg.by, cfg.samples)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
