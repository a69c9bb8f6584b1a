"""α sweeps (kill and resume), selection across a sweep, and the run report, on a tiny world."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from captioner import report as report_cli
from captioner import select as select_cli
from captioner import sweep as sweep_cli
from captioner.train_config import TrainConfig
from plumbing.config import load_config
from plumbing.references import load_references
from rewards import RewardBank, ScoringContext
from tests.captioner_fixtures import ROOT, tiny_config, tiny_sweep

ALPHAS = [0.0, 0.5, 1.0]


@pytest.fixture(scope="module")
def sweep_setup(tiny_world, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sweep")
    sweep, _ = tiny_sweep(tiny_world, root, 2, ["bleu_4", "cider", "cider_d", "mean_length", "repeat_2"],
                          alphas=ALPHAS)
    base = root / "scst_base.yaml"
    return {"root": root, "sweep": sweep, "dir": root / "sweeps" / "sw", "base": base}


def run_until_second_point_is_half_done(sweep: Path, second_run: Path) -> None:
    """Start the sweep in a subprocess and SIGKILL it once the second run has finished epoch 0 of 2."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "captioner.sweep", "--config", str(sweep), "--no-progress"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not (second_run / "checkpoints" / "last").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline, "the sweep did not reach its second run in time"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def killed_and_resumed(sweep_setup) -> dict:
    first, second = (sweep_setup["dir"] / sweep_cli.run_name(a) for a in ALPHAS[:2])
    run_until_second_point_is_half_done(sweep_setup["sweep"], second)
    assert os.readlink(second / "checkpoints" / "last") == "epoch_0"
    first_log = (first / "metrics.jsonl").stat().st_mtime_ns, (first / "metrics.jsonl").read_bytes()
    assert not (sweep_setup["dir"] / "alpha_1").exists()
    code = sweep_cli.main(["--config", str(sweep_setup["sweep"]), "--no-progress"])
    return {**sweep_setup, "code": code, "first": first, "second": second, "first_log": first_log}


def rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def test_killed_sweep_reruns_only_what_is_missing(killed_and_resumed, capsys):
    done = killed_and_resumed
    assert done["code"] == 0
    first_log = (done["first"] / "metrics.jsonl").stat().st_mtime_ns, (done["first"] / "metrics.jsonl").read_bytes()
    assert first_log == done["first_log"]  # the finished run was not touched
    second = [json.loads(line) for line in (done["second"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in second] == [0, 1]  # resumed at epoch 1, no duplicate epoch 0
    manifest = json.loads((done["dir"] / "sweep.json").read_text())
    assert [r["status"] for r in manifest["runs"]] == ["skipped", "trained", "trained"]
    third = load_config(TrainConfig, done["dir"] / "alpha_1" / "config.yaml")
    assert third.scst.rewards == {"bleu_4": 1.0, "cider_d": 0.0}
    # a third invocation trains nothing
    capsys.readouterr()
    assert sweep_cli.main(["--config", str(done["sweep"]), "--no-progress"]) == 0
    assert capsys.readouterr().out.count("finished earlier") == 3


def test_summary_is_each_run_at_its_best_epoch(killed_and_resumed):
    sweep = killed_and_resumed["dir"]
    start, *table = rows(sweep / "summary.csv")
    assert [float(r["alpha"]) for r in table] == ALPHAS
    start_json = json.loads((sweep / "start.json").read_text())
    assert start["alpha"] == "start" and start["run"] == start_json["checkpoint"]
    assert float(start["cider"]) == pytest.approx(start_json["cider"], rel=1e-12)
    xe_epoch = json.loads((killed_and_resumed["root"] / "xe" / "metrics.jsonl").read_text().splitlines()[-1])
    assert start_json["cider"] == pytest.approx(xe_epoch["cider"], rel=1e-6)  # scored as the XE run scored it
    for row in table:
        records = [json.loads(line) for line in (sweep / row["run"] / "metrics.jsonl").read_text().splitlines()]
        best = max(records, key=lambda r: r["cider"])
        assert int(row["epoch"]) == best["epoch"]
        assert float(row["cider_d"]) == pytest.approx(best["cider_d"], rel=1e-12)
    markdown = (sweep / "summary.md").read_text()
    assert "α·bleu_4 + (1−α)·cider_d" in markdown and markdown.count("\n| 0.5 |") == 1
    assert (sweep / "alpha_metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(sweep / "tensorboard" / "alpha_0.5")).Reload()
    assert "hparam/cider" in events.Tags()["scalars"]
    assert sorted(p.name for p in (sweep / "tensorboard").iterdir()) == ["alpha_0", "alpha_0.5", "alpha_1"]


def test_select_across_the_sweep_prints_the_winner_with_its_row(killed_and_resumed, capsys):
    sweep = killed_and_resumed["dir"]
    assert select_cli.main(["--sweep", str(sweep), "--by", "repeat_2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    candidates = [json.loads(line) for run in ("alpha_0", "alpha_0.5", "alpha_1")
                  for line in (sweep / run / "metrics.jsonl").read_text().splitlines()]
    assert result["value"] == min(r["repeat_2"] for r in candidates)  # repeat_2: lower is better
    assert {"bleu_4", "cider", "cider_d", "mean_length", "val_loss"} <= set(result["metrics"])
    assert select_cli.main(["--sweep", str(sweep / "nope")]) == 2


def test_paired_selection_rescores_each_runs_captions_per_image(killed_and_resumed, capsys):
    """--paired: every other run's chosen epoch against the chosen one on the same val images; the
    per-image CIDEr means are the logged corpus values, and the interval holds the mean difference."""
    sweep = killed_and_resumed["dir"]
    capsys.readouterr()
    assert select_cli.main(["--sweep", str(sweep), "--by", "cider", "--paired"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert "95% bootstrap interval" in out and len(result["paired"]) == 2
    assert result["paired"][0]["chosen_rescored"] == pytest.approx(result["value"], rel=1e-9)
    for row in result["paired"]:
        records = [json.loads(line) for line in (sweep / row["run"] / "metrics.jsonl").read_text().splitlines()]
        logged = next(r["cider"] for r in records if r["epoch"] == row["epoch"])
        assert row["rescored"] == pytest.approx(logged, rel=1e-9)
        assert row["difference"] == pytest.approx(row["chosen_rescored"] - row["rescored"], abs=1e-9)
        assert row["low"] <= row["difference"] <= row["high"] and row["difference"] >= 0  # the chosen is the best
        assert row["chosen_ahead"] + row["run_ahead"] <= row["images"] and 0 < row["p"] <= 1
    assert select_cli.main(["--sweep", str(sweep), "--by", "repeat_2", "--paired"]) == 0  # lower is better
    for row in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["paired"]:
        assert row["difference"] == pytest.approx(row["rescored"] - row["chosen_rescored"], abs=1e-9)
    assert select_cli.main(["--run", str(sweep / "alpha_0"), "--paired"]) == 2
    assert "--paired compares the runs of a sweep" in capsys.readouterr().err
    assert select_cli.main(["--sweep", str(sweep), "--by", "val_loss", "--paired"]) == 2
    assert "val_loss is a loss" in capsys.readouterr().err


def test_report_names_the_choice_and_scores_samples_with_every_reward(killed_and_resumed):
    run = killed_and_resumed["second"]
    assert report_cli.main(["--run", str(run), "--by", "bleu_4", "--samples", "3"]) == 0
    text = (run / "report.md").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    best = max(records, key=lambda r: r["bleu_4"])
    assert f"Chosen by **bleu_4** (max): epoch {best['epoch']}, bleu_4 = {best['bleu_4']:.4f}" in text
    for section in ("## Per-epoch metrics", "## Curves", "## Sample captions", "## Resolved config"):
        assert section in text
    assert (run / "report_metrics.png").exists() and (run / "report_rewards.png").exists()
    assert "`clip_s` (clip_s needs reward_models.clip" in text  # no CLIP model configured: said, not hidden
    header = next(line for line in text.splitlines() if line.startswith("| image | caption"))
    names = [c.strip() for c in header.strip("|").split("|")]
    assert {"bleu_4", "cider", "cider_d", "length"} <= set(names)
    first = next(line for line in text.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit())
    cells = [c.strip() for c in first.strip("|").split("|")]
    image_id, caption = int(cells[0]), cells[1]
    cfg = load_config(TrainConfig, run / "config.yaml")
    bank = RewardBank.from_config({"cider_d": 1.0}, ScoringContext(
        references=load_references(cfg.data.refs), cider_df=cfg.data.cider_df))
    assert float(cells[names.index("cider_d")]) == pytest.approx(float(bank([caption], [image_id]).total[0]), abs=6e-4)


def test_bad_sweeps_name_what_is_wrong(sweep_setup, tmp_path, capsys):
    sweep = sweep_setup["sweep"]
    assert sweep_cli.main(["--config", str(sweep), "--set", "alphas=[0.2, 1.5]"]) == 2
    assert "[1.5]" in capsys.readouterr().err
    assert sweep_cli.main(["--config", str(sweep), "--set", "alpha=[0.5]"]) == 2
    assert "'alpha'" in capsys.readouterr().err
    xe_base = tiny_config({}, tmp_path, name="xe_only")
    assert sweep_cli.main(["--config", str(sweep), "--set", f"base={xe_base}"]) == 2
    assert "a sweep runs SCST" in capsys.readouterr().err
    # names the runs would only meet at the end (a reward at the first step, select_by at the summary)
    fresh = ["--set", f"out_dir={tmp_path / 'fresh'}"]
    assert sweep_cli.main(["--config", str(sweep), *fresh, "--set", "reward_a=clip_ss"]) == 2
    assert "unknown reward 'clip_ss'; known rewards:" in capsys.readouterr().err
    assert sweep_cli.main(["--config", str(sweep), *fresh, "--set", "select_by=meteorr"]) == 2
    assert "select_by 'meteorr' is not among the metrics the runs compute" in capsys.readouterr().err
    assert not list((tmp_path / "fresh").glob("*/alpha_*"))
    # a run folder trained with another mix is not resumed as this sweep's run
    other = tmp_path / "other" / "alpha_0.5"
    other.mkdir(parents=True)
    (other / "config.yaml").write_text(yaml.safe_dump({"scst": {"rewards": {"cider_d": 1.0}}}))
    assert sweep_cli.main(["--config", str(sweep), "--set", f"out_dir={tmp_path}", "--set", "name=other",
                           "--set", "alphas=[0.5]"]) == 2
    assert "alpha_0.5 was trained with scst.rewards" in capsys.readouterr().err
    assert report_cli.main(["--run", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err


def test_accelerate_launcher_runs_each_point_under_its_own_launch(sweep_setup, tmp_path):
    """`launcher: accelerate` with 2 CPU processes: one metrics line per epoch, written once."""
    sweep = tmp_path / "launched.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "launched", "out_dir": str(tmp_path), "base": str(sweep_setup["base"]), "reward_a": "bleu_4",
        "reward_b": "cider_d", "alphas": [0.5], "select_by": "cider", "launcher": "accelerate", "num_processes": 2,
        "overrides": ["train.epochs=1", "data.batch_size=4"]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "captioner.sweep", "--config", str(sweep), "--no-progress"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = (tmp_path / "launched" / "alpha_0.5" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["stage"] == "scst"
    assert len(rows(tmp_path / "launched" / "summary.csv")) == 2  # start + one α
