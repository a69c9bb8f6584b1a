"""docs/adding_a_reward.md, run as written: its module registers a reward and a metric, its YAML mixes
the reward into SCST (the base config swapped for a tiny one), the run logs it per step and evaluates
it per epoch, and rewards.score scores it as a metric."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from captioner import train as train_cli
from rewards import score as score_cli
from tests.captioner_fixtures import prepare_tiny_data, tiny_config

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding_a_reward.md"


def fenced(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


@pytest.fixture()
def in_user_folder(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(fenced("python")[0])
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("my_rewards", None)


def test_the_guide_runs_as_written(tiny_world, in_user_folder):
    folder = in_user_folder
    data = prepare_tiny_data(tiny_world, folder)
    xe = tiny_config(data, folder, name="xe", train={"epochs": 1})
    assert train_cli.main(["--config", str(xe), "--no-progress"]) == 0
    base = tiny_config(data, folder, name="base", train={"epochs": 1, "stage": "scst", "log_every": 1},
                       optim={"lr": 1e-4, "warmup_steps": 0}, scst={"k": 3, "init_from": str(folder / "xe" /
                                                                                             "checkpoints" / "last")})
    guide = yaml.safe_load(fenced("yaml")[0])
    assert guide["inherit"] == "configs/demo_scst.yaml" and (ROOT / guide["inherit"]).is_file()
    guide["inherit"] = str(base)  # the demo's config needs the demo's outputs: a tiny base, the guide's keys
    guide["run"]["out_dir"] = str(folder)
    guide["scst"]["rewards"] = {k: v for k, v in guide["scst"]["rewards"].items() if k != "clip_s"}  # no CLIP here
    guide["eval"]["metrics"] = [m for m in guide["eval"]["metrics"] if m not in ("clip_s", "specs")]
    guide["eval"]["select_by"] = "distinct_words"
    (folder / "my_scst.yaml").write_text(yaml.safe_dump(guide))
    command = fenced("bash")[0].split()
    assert command[:3] == ["python", "-m", "captioner.train"]
    assert train_cli.main([*command[3:], "--no-progress"]) == 0

    run = folder / guide["run"]["name"]
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0.0 < record["distinct_words"] <= 1.0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(run / "tensorboard")).Reload().Tags()["scalars"]
    assert "train/reward/distinct_words/mean" in scalars

    results = folder / "results.json"
    results.write_text(json.dumps([{"image_id": 1, "caption": "a red circle and a red circle"},
                                   {"image_id": 2, "caption": "a blue star"}]))
    scoring = fenced("bash")[1].split()
    assert scoring[:3] == ["python", "-m", "rewards.score"]
    out = folder / "scores.json"
    assert score_cli.main([w.replace("results.json", str(results)) for w in scoring[3:]] + ["--out", str(out)]) == 0
    per_item = json.loads(out.read_text())["per_item"]["distinct_words"]
    assert per_item == {"1": pytest.approx(4 / 7), "2": 1.0}


def test_a_plugin_that_does_not_import_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text(json.dumps([{"image_id": 1, "caption": "a dog"}]))
    assert score_cli.main(["--plugins", "no_such_rewards", "--predictions", "r.json", "--metrics", "mean_length"]) == 2
    assert "plugins: cannot import 'no_such_rewards'" in capsys.readouterr().err
