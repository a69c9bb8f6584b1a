"""XE training end to end on a tiny world: logs, checkpoints, exact resume, distributed parity."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from captioner import evaluate as evaluate_cli
from captioner import select as select_cli
from captioner import train as train_cli
from tests.captioner_fixtures import (
    launch_two_processes,
    prepare_tiny_data,
    tiny_config,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_data(tiny_world, tmp_path_factory):
    return prepare_tiny_data(tiny_world, tmp_path_factory.mktemp("tinydata"))


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir: Path, tag: str = "last") -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / tag / "model.safetensors"))


def test_xe_run_writes_everything_and_evaluates(tiny_data, tmp_path, capsys):
    cfg = tiny_config(tiny_data, tmp_path, train={"epochs": 3})
    assert train_cli.main(["--config", str(cfg), "--no-progress"]) == 0
    run = tmp_path / "tiny"
    records = metrics(run)
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    assert {"cider", "bleu_4", "object_recall", "train_loss"} <= set(records[0])
    samples = json.loads((run / "samples" / "epoch_2.json").read_text())
    assert len(samples) == 12 and {"image_id", "caption"} <= set(samples[0])
    ckpts = run / "checkpoints"
    assert os.readlink(ckpts / "last") == "epoch_2" and (ckpts / "best").is_symlink()
    assert sorted(p.name for p in ckpts.iterdir() if not p.is_symlink()) == sorted(
        {"epoch_1", "epoch_2", os.readlink(ckpts / "best")})  # keep_last 2, best kept
    assert (run / "config.yaml").exists() and any((run / "tensorboard").iterdir())
    out = tmp_path / "test_results.json"
    assert evaluate_cli.main(["--checkpoint", str(ckpts / "best"), "--split", "test", "--beam", "2",
                              "--out", str(out)]) == 0
    assert len(json.loads(out.read_text())) == 12 and out.with_suffix(".scores.json").exists()
    assert select_cli.main(["--run", str(run), "--by", "val_loss"]) == 0
    assert '"by": "val_loss"' in capsys.readouterr().out
    _an_earlier_releases_checkpoint_config_still_loads(ckpts / "best")


def _an_earlier_releases_checkpoint_config_still_loads(checkpoint: Path) -> None:
    import yaml

    from captioner.inference import load_captioner

    saved = yaml.safe_load((checkpoint / "config.yaml").read_text())
    saved["eval"].update(decode="greedy", beam_size=3)  # the layout before eval.decode was dropped
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(saved))
    _, cfg, _ = load_captioner(checkpoint)
    assert cfg.eval.beam_size == 1


def _train_subprocess(cfg: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "captioner.train", "--config", str(cfg), "--no-progress", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_sigkill_mid_epoch_then_resume_gives_the_same_weights(tiny_data, tmp_path):
    sections = {"train": {"epochs": 2}, "checkpoint": {"every_steps": 1, "keep_last": 20},
                "data": {"workers": 1}}
    straight = tiny_config(tiny_data, tmp_path, name="straight", **sections)
    assert _train_subprocess(straight).wait(timeout=300) == 0
    killed = tiny_config(tiny_data, tmp_path, name="killed", **sections)
    proc = _train_subprocess(killed)
    step_ckpt = tmp_path / "killed" / "checkpoints" / "step_7"  # 5 steps per epoch: 2 batches into epoch 1
    deadline = time.time() + 300
    while not step_ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert step_ckpt.exists(), "the run ended before its mid-epoch checkpoint"
    assert not (tmp_path / "killed" / "checkpoints" / "epoch_1").exists()
    resumed = _train_subprocess(killed, "--resume", "latest")
    output = resumed.communicate(timeout=300)[0].decode()
    assert resumed.returncode == 0, output
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "killed")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert [r["epoch"] for r in metrics(tmp_path / "killed")] == [0, 1]
    # the interrupted epoch's train_loss covers its batches before the kill too
    straight_loss = [r["train_loss"] for r in metrics(tmp_path / "straight")]
    assert [r["train_loss"] for r in metrics(tmp_path / "killed")] == pytest.approx(straight_loss, rel=1e-9)


def test_two_processes_match_one_with_the_same_global_batch(tiny_data, tmp_path):
    """Two processes with 4 images each vs one with 8 (dropout off). Tolerance: 1e-4 on val loss and
    0.02 on CIDEr (all-reduce sums in another order). accelerate 1.x runs `launch --cpu` as a single
    process (multi-CPU there means mpirun), so two CPU processes come from the torchrun launcher:
    `--multi_gpu` on a machine without GPUs, which rlcap's trainer turns into MULTI_CPU (gloo)."""
    sections = {"model": {"dropout": 0.0}, "train": {"epochs": 2}}
    one = tiny_config(tiny_data, tmp_path, name="one", data={"batch_size": 8}, **sections)
    two = tiny_config(tiny_data, tmp_path, name="two", data={"batch_size": 4}, **sections)
    assert _train_subprocess(one).wait(timeout=300) == 0
    result = launch_two_processes(two)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert len(m2) == 2  # one line per epoch: only the main process writes
    for r1, r2 in zip(m1, m2, strict=True):
        assert abs(r1["val_loss"] - r2["val_loss"]) < 1e-4
        assert abs(r1["cider"] - r2["cider"]) < 0.02
    assert len(json.loads((tmp_path / "two" / "samples" / "epoch_1.json").read_text())) == 12


def test_bad_inputs_name_what_differs(tiny_data, tmp_path, capsys):
    cfg = tiny_config(tiny_data, tmp_path, name="bad", train={"epochs": 1})
    assert train_cli.main(["--config", str(cfg), "--set", "optim.learning_rate=1"]) == 2
    assert "unknown config key 'optim.learning_rate'" in capsys.readouterr().err
    assert train_cli.main(["--config", str(cfg), "--set", "model.enc_layers=0", "--set", "run.name=e0"]) == 2
    assert "model.enc_layers must be at least 1, got 0" in capsys.readouterr().err
    assert train_cli.main(["--config", str(cfg), "--no-progress"]) == 0
    assert train_cli.main(["--config", str(cfg), "--resume", "latest", "--set", "model.d_model=64"]) == 2
    assert "model config differs: model.d_model: checkpoint 32, now 64" in capsys.readouterr().err
    # a features file that does not cover the dataset
    import h5py

    partial = tmp_path / "partial.h5"
    with h5py.File(tiny_data["feats"], "r") as src, h5py.File(partial, "w") as dst:
        for key in src:
            dst.create_dataset(key, data=src[key][:-3])
        dst.attrs.update(dict(src.attrs))
    assert train_cli.main(["--config", str(cfg), "--set", f"data.feats={partial}", "--set", "run.name=p"]) == 2
    assert "no features for" in capsys.readouterr().err
    # a checkpoint whose vocabulary differs from the data's
    vocab = json.loads(Path(tiny_data["vocab"]).read_text())
    vocab["ix_to_word"]["1"] = "zzz"
    other = tmp_path / "other_vocab.json"
    other.write_text(json.dumps(vocab))
    code = evaluate_cli.main(["--checkpoint", str(tmp_path / "bad" / "checkpoints" / "last"), "--split", "val",
                              "--out", str(tmp_path / "r.json"), "--set", f"data.vocab={other}"])
    assert code == 2 and "vocabulary differs" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
