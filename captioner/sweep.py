"""`python -m captioner.sweep --config configs/ablate_alpha.yaml [--set key=value]`

An α sweep over a two-reward mix: for each α in `alphas` (and each seed in `seeds`, when given), one
SCST run of α·reward_a + (1−α)·reward_b, every run starting from the base config's `scst.init_from`
(one shared XE checkpoint). Runs go one after another, in this process or each under its own
`accelerate launch` (`launcher: accelerate`). The sweep is resumable: finished runs are skipped,
an interrupted run continues from its last checkpoint.

At the end (and with --summary-only) it writes, under <out_dir>/<name>/:
  start.json               the val metrics of the shared starting checkpoint
  summary.md, summary.csv  α against every metric, each run at its best epoch by `select_by`,
                           below a first row for the starting checkpoint; with seeds, per α the mean
                           over the seeds and its 95% interval (Student's t), then every run
  alpha_metrics.png        the metrics plotted against α (with seeds: the means and their intervals)
  tensorboard/             one hparams entry per run
and prints the best run and epoch by `select_by` (as `python -m captioner.select --sweep` does).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from captioner.checkpoint import finished_epochs
from captioner.seed_groups import parse_run_name, run_name
from captioner.start import score_start
from captioner.sweep_summary import SweepPoint, write_summary
from captioner.train_config import TrainConfig
from plumbing.atomic import write_json
from plumbing.cli import EXIT_INTERRUPTED, command, config_parser, parse_config
from plumbing.config import apply_overrides, build, dump_config, option, read_yaml, to_dict
from plumbing.errors import ConfigError, RlcapError
from plumbing.plugins import import_plugins
from rewards import available_rewards


@dataclass
class SweepConfig:
    name: str = option("sweep", help="the sweep's folder name under out_dir (one run folder per α)")
    out_dir: str = option("runs", help="where the sweep folder goes")
    base: str = option("", help="the SCST training config every run starts from")
    reward_a: str = option("l_clip_s", help="the reward weighted by α")
    reward_b: str = option("cider_d", help="the reward weighted by 1 − α")
    alphas: list[float] = option(factory=lambda: [0.0, 0.3, 0.5, 0.7, 1.0], help="the α values in [0, 1], one run each")
    seeds: list[int] | None = option(None, help="run every α at each of these run.seed values, one run folder "
                                     "alpha_<α>_seed_<s> each (summaries give the mean over seeds and its 95%% "
                                     "interval); null: one run per α at the base config's seed, folder alpha_<α>")
    select_by: str = option("specs", help="each run's row in the summary is its best epoch by this metric")
    select_mode: Literal["auto", "max", "min"] = option("auto", help="auto: the metric's own direction")
    overrides: list[str] = option(factory=list, help="`key=value` applied to every run's config", flag=False)
    launcher: Literal["inprocess", "accelerate"] = option(
        "inprocess", help="runs in this process, or each under its own `accelerate launch`")
    num_processes: int = option(1, help="processes per run under `launcher: accelerate`", at_least=1)


def sweep_points(cfg: SweepConfig) -> list[tuple[float, int | None]]:
    """(α, seed) of every run, seed by seed (every α at the first seed, then at the next), so a sweep cut
    short holds whole replicates of the grid; seed None where the sweep has no seed list."""
    return [(alpha, seed) for seed in (cfg.seeds if cfg.seeds is not None else [None]) for alpha in cfg.alphas]


def check_sweep(cfg: SweepConfig) -> None:
    if not cfg.base:
        raise ConfigError("sweep config needs 'base': the SCST training config each run starts from")
    if not cfg.alphas:
        raise ConfigError("sweep config 'alphas' is empty")
    bad = [a for a in cfg.alphas if not 0.0 <= a <= 1.0]
    if bad:
        raise ConfigError(f"sweep config 'alphas': every α must lie in [0, 1]; got {bad}")
    if len({run_name(a) for a in cfg.alphas}) != len(cfg.alphas):
        raise ConfigError(f"sweep config 'alphas' repeats a value: {cfg.alphas}")
    if cfg.seeds is not None and not cfg.seeds:
        raise ConfigError("sweep config 'seeds' is empty: give at least one seed, or null for one run per α at the "
                          "base config's seed")
    if cfg.seeds is not None and len(set(cfg.seeds)) != len(cfg.seeds):
        raise ConfigError(f"sweep config 'seeds' repeats a value: {cfg.seeds}")
    if cfg.reward_a == cfg.reward_b:
        raise ConfigError(f"reward_a and reward_b are both {cfg.reward_a!r}")
    import_plugins(read_yaml(cfg.base, TrainConfig).get("run", {}).get("plugins") or [])  # their rewards count too
    known = available_rewards()
    unknown = [name for name in (cfg.reward_a, cfg.reward_b) if name not in known]
    if unknown:
        raise ConfigError(f"unknown reward {unknown[0]!r}; known rewards: {', '.join(known)}")
    if cfg.num_processes < 1:
        raise ConfigError("num_processes must be >= 1")


def check_seed_list(cfg: SweepConfig) -> None:
    """Run folders of this sweep made under another seed list (or without one, or with one where this
    sweep has none) would be summarised beside these as if they were the same experiment: refused."""
    folder = sweep_dir(cfg)
    if not folder.is_dir():
        return
    wanted = set(cfg.seeds) if cfg.seeds is not None else None
    foreign = []
    for run in sorted(p for p in folder.iterdir() if p.is_dir() and (p / "config.yaml").exists()):
        parsed = parse_run_name(run.name)
        if parsed is None:
            continue
        seed = parsed[1]
        if (wanted is None) != (seed is None) or (seed is not None and seed not in wanted):
            foreign.append(run.name)
    if foreign:
        listed = ", ".join(foreign[:6]) + (", ..." if len(foreign) > 6 else "")
        now = f"seeds {cfg.seeds}" if cfg.seeds is not None else "no seed list"
        raise ConfigError(f"{folder} holds runs from another seed list ({listed}); this sweep has {now}: move those "
                          "runs away, give the sweep another name, or set 'seeds' to match them")


def check_select_by(cfg: SweepConfig, start: dict) -> None:
    """select_by is read at the very end: a metric the runs do not compute must stop the sweep before
    hours of training, not after."""
    numbers = {key for key, value in start.items() if isinstance(value, int | float) and not isinstance(value, bool)}
    computed = sorted(numbers | {"train_loss", "val_loss"})
    if cfg.select_by not in computed:
        raise ConfigError(f"select_by {cfg.select_by!r} is not among the metrics the runs compute "
                          f"(those of {cfg.base}): {', '.join(computed)}")


def run_config(cfg: SweepConfig, alpha: float, seed: int | None = None) -> TrainConfig:
    """The base config with the sweep's overrides, this α's reward mix, its seed and the run's place."""
    data = apply_overrides(read_yaml(cfg.base, TrainConfig), cfg.overrides)
    data.setdefault("run", {}).update(name=run_name(alpha, seed), out_dir=str(sweep_dir(cfg)))
    if seed is not None:
        data["run"]["seed"] = seed
    data.setdefault("scst", {})["rewards"] = {cfg.reward_a: alpha, cfg.reward_b: round(1.0 - alpha, 10)}
    train = build(TrainConfig, data)
    if train.train.stage != "scst":
        raise ConfigError(f"{cfg.base}: train.stage is {train.train.stage!r}; a sweep runs SCST")
    if not train.scst.init_from:
        raise ConfigError(f"{cfg.base}: scst.init_from is empty; the sweep's runs share one XE checkpoint")
    return train


def sweep_dir(cfg: SweepConfig) -> Path:
    return Path(cfg.out_dir) / cfg.name


def check_same_run(run: Path, train: TrainConfig) -> None:
    """A folder left by another sweep setting must not be resumed as if it were this one."""
    saved_path = run / "config.yaml"
    if not saved_path.exists():
        return
    saved, now = read_yaml(saved_path), to_dict(train)
    for section, key in (("scst", "rewards"), ("scst", "init_from"), ("run", "seed"), ("model", None)):
        before = saved.get(section, {}) if key is None else saved.get(section, {}).get(key)
        after = now[section] if key is None else now[section][key]
        if before != after:
            where = section if key is None else f"{section}.{key}"
            raise ConfigError(f"{run} was trained with {where} = {before!r}, this sweep asks for {after!r}; "
                              f"move that folder away or give the sweep another name")


def launch(cfg: SweepConfig, config_path: Path, progress: bool) -> None:
    args = ["--config", str(config_path), "--resume", "auto"] + ([] if progress else ["--no-progress"])
    if cfg.launcher == "inprocess":
        from captioner import train

        code = train.main(args)
    else:
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(cfg.num_processes)]
        launcher += ["--multi_gpu"] if cfg.num_processes > 1 else []
        code = subprocess.run([*launcher, "-m", "captioner.train", *args], check=False).returncode
    if code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt
    if code != 0:
        raise RlcapError(f"the run configured by {config_path} failed (exit {code}); re-run the sweep to resume it")


def run_point(cfg: SweepConfig, alpha: float, seed: int | None, index: int, progress: bool) -> SweepPoint:
    train = run_config(cfg, alpha, seed)
    run = sweep_dir(cfg) / run_name(alpha, seed)
    check_same_run(run, train)
    mix = f"{alpha:g}·{cfg.reward_a} + {1 - alpha:g}·{cfg.reward_b}" + ("" if seed is None else f", seed {seed}")
    head = f"[sweep] {index + 1}/{len(sweep_points(cfg))} {run.name} ({mix})"
    done = finished_epochs(run)
    if done >= train.train.epochs:
        print(f"{head}: finished earlier ({done} epochs), skipped", flush=True)
        return SweepPoint(alpha, run, "skipped", 0.0, seed)
    print(f"{head}: {'resuming at epoch ' + str(done) if done else 'training'}", flush=True)
    config_path = sweep_dir(cfg) / "configs" / f"{run.name}.yaml"
    dump_config(train, config_path)
    start = time.perf_counter()
    launch(cfg, config_path, progress)
    return SweepPoint(alpha, run, "trained", time.perf_counter() - start, seed)


def sweep_start(cfg: SweepConfig) -> dict:
    """Val metrics of the shared starting checkpoint, decoded and scored exactly as every run's
    epochs are: the row each α is compared with (start.json)."""
    alpha, seed = sweep_points(cfg)[0]
    return score_start(run_config(cfg, alpha, seed), sweep_dir(cfg) / "start.json")


def write_manifest(cfg: SweepConfig, points: list[SweepPoint]) -> None:
    write_json(sweep_dir(cfg) / "sweep.json", {
        "sweep": to_dict(cfg), "runs": [
            {"alpha": p.alpha, "seed": p.seed, "run": p.run.name, "status": p.status, "seconds": round(p.seconds, 1)}
            for p in points]},
        indent=1)


def build_parser() -> argparse.ArgumentParser:
    parser = config_parser(SweepConfig, "python -m captioner.sweep", __doc__)
    parser.add_argument("--summary-only", action="store_true",
                        help="train nothing; rewrite the summary, plot and hparams from the runs there")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars inside the runs")
    return parser


@command
def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_config(SweepConfig, build_parser(), argv)
    check_sweep(cfg)
    check_seed_list(cfg)
    start = sweep_start(cfg)
    check_select_by(cfg, start)
    points = []
    for index, (alpha, seed) in enumerate(sweep_points(cfg)):
        if args.summary_only:
            points.append(SweepPoint(alpha, sweep_dir(cfg) / run_name(alpha, seed), "summary-only", 0.0, seed))
            continue
        points.append(run_point(cfg, alpha, seed, index, not args.no_progress))
        write_manifest(cfg, points)
    mode = None if cfg.select_mode == "auto" else cfg.select_mode
    summary = write_summary(sweep_dir(cfg), points, cfg.select_by, mode, (cfg.reward_a, cfg.reward_b), start)
    print(summary.markdown)
    print(f"[sweep] wrote {summary.markdown_path}, {summary.csv_path}, {summary.plot_path} and tensorboard hparams")
    print(f"[sweep] best by {cfg.select_by}: {summary.best_text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
