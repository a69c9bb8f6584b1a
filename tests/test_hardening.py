"""Hostile inputs and faults: nothing already written is lost, every fault is one named line with
exit 2, only valid config values pass, images decode correctly, scores stay valid JSON."""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioner import prepro as prepro_cli
from captioner import train as train_cli
from features import extract as extract_cli
from features.images import open_rgb
from plumbing.cli import command
from plumbing.config import load_config
from plumbing.errors import ConfigError, DataError
from rewards import score as score_cli
from tests.captioner_fixtures import prepare_tiny_data, tiny_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_data(tiny_world, tmp_path_factory):
    return prepare_tiny_data(tiny_world, tmp_path_factory.mktemp("harddata"))


def _train(cfg: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "captioner.train", "--config", str(cfg), "--no-progress", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=_ctrl_c_as_at_a_terminal)


def _ctrl_c_as_at_a_terminal() -> None:
    # a shell that starts the tests in the background hands them SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored; the child should see Ctrl-C as a user at a terminal would
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _snapshot(run: Path) -> dict[str, bytes]:
    return {name: (run / name).read_bytes() for name in ("config.yaml", "metrics.jsonl")}


# --- nothing lost ------------------------------------------------------------------------------


def test_a_start_that_fails_leaves_the_existing_run_untouched(tiny_data, tmp_path, capsys):
    cfg = tiny_config(tiny_data, tmp_path, name="kept", train={"epochs": 1})
    assert train_cli.main(["--config", str(cfg), "--no-progress"]) == 0
    run = tmp_path / "kept"
    before = _snapshot(run)
    assert train_cli.main(["--config", str(cfg), "--resume", "auto", "--set", "eval.select_by=nope"]) == 2
    assert "eval.select_by 'nope' is not among the metrics" in capsys.readouterr().err
    assert train_cli.main(["--config", str(cfg), "--set", "train.epochs=3"]) == 2  # a fresh start over it
    assert "already holds a run (1 epoch(s) logged)" in capsys.readouterr().err
    assert _snapshot(run) == before


def test_an_unknown_select_by_stops_before_any_training(tiny_data, tmp_path, capsys):
    cfg = tiny_config(tiny_data, tmp_path, name="fresh", train={"epochs": 1})
    start = time.perf_counter()
    assert train_cli.main(["--config", str(cfg), "--set", "eval.select_by=meteorr"]) == 2
    assert "'meteorr' is not among the metrics this run computes" in capsys.readouterr().err
    assert not (tmp_path / "fresh" / "config.yaml").exists() and time.perf_counter() - start < 60


def test_a_second_process_on_the_same_run_exits_naming_the_first(tiny_data, tmp_path):
    cfg = tiny_config(tiny_data, tmp_path, name="shared", train={"epochs": 200})  # still running when checked
    first = _train(cfg)
    lock = tmp_path / "shared" / ".lock"
    deadline = time.time() + 120
    while not (lock.exists() and lock.read_text().strip()) and time.time() < deadline and first.poll() is None:
        time.sleep(0.01)
    second = _train(cfg, "--resume", "auto")
    out = second.communicate(timeout=120)[0].decode()
    running = first.poll() is None
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=120) == 130 and running
    assert second.returncode == 2 and f"PID {first.pid}" in out, out
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "shared" / "metrics.jsonl").read_text().splitlines()]
    assert epochs == list(range(len(epochs)))


def test_prepro_killed_midway_keeps_the_finished_set(tiny_world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "data"
    args = ["--dataset", str(tiny_world / "dataset.json"), "--out", str(out), "--min-count", "1"]
    assert prepro_cli.main([*args, "--max-len", "12"]) == 0

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepro_cli, "save_df", killed)
    assert prepro_cli.main([*args, "--max-len", "7", "--force"]) == 130  # labels.h5 rebuilt beside, the rest not
    monkeypatch.undo()
    capsys.readouterr()
    assert prepro_cli.main([*args, "--max-len", "12"]) == 0
    assert "up to date" in capsys.readouterr().out
    import h5py

    with h5py.File(out / "labels.h5") as h5:
        assert int(h5.attrs["max_len"]) == 12
    assert prepro_cli.main([*args, "--max-len", "7"]) == 0
    assert "up to date" not in capsys.readouterr().out


def test_corrupt_partials_left_by_a_crash_are_set_aside(tiny_world, tmp_path, capsys):
    feats = tmp_path / "feats.h5"
    Path(str(feats) + ".partial").write_bytes(b"\x89HDF\r\n\x1a\n" + os.urandom(2000))  # a crash mid-write
    assert extract_cli.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                             "--out", str(feats), "--workers", "0"]) == 0
    assert "moved it to" in capsys.readouterr().err
    assert feats.exists() and list(tmp_path.glob("feats.h5.partial.corrupt-*"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "labels.h5.partial").write_bytes(os.urandom(500))
    assert prepro_cli.main(["--dataset", str(tiny_world / "dataset.json"), "--out", str(tmp_path / "data")]) == 0


# --- one error path ----------------------------------------------------------------------------


def _failing(exc: BaseException):
    @command
    def main(argv=None):
        raise exc

    return main


@pytest.mark.parametrize("exc,needle", [
    (OSError(errno.EROFS, "Read-only file system", "/ro/out/metrics.jsonl"), "/ro/out/metrics.jsonl is on a read-only"),
    (OSError(errno.ENOSPC, "No space left on device", "/full/feats.h5"), "no space left on the device while writing"),
    (OSError(errno.EACCES, "Permission denied", "/root/x"), "permission denied: /root/x"),
    (Image.DecompressionBombError("Image size (2500000000 pixels) exceeds limit"), "too large to decode safely"),
    (ValueError("Expected a tensor\nwith more lines"), "ValueError: Expected a tensor with more lines"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 491520000000 bytes."), "out of memory ([enforce fail"),
])
def test_every_fault_is_one_line_and_exit_2(exc, needle, capsys, monkeypatch):
    monkeypatch.delenv("RLCAP_DEBUG", raising=False)
    assert _failing(exc)([]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_full_disk_names_the_bytes_needed(tmp_path, monkeypatch, capsys):
    from plumbing import atomic

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    assert _failing_write(tmp_path / "x.json")([]) == 2
    err = capsys.readouterr().err
    assert "x.json" in err and "bytes more are needed" in err


def _failing_write(path: Path):
    from plumbing.atomic import write_json

    @command
    def main(argv=None):
        write_json(path, {"a": 1})

    return main


def test_truncated_weights_are_a_named_error(tiny_data, tmp_path, capsys):
    from captioner import evaluate as evaluate_cli

    cfg = tiny_config(tiny_data, tmp_path, name="w", train={"epochs": 1})
    assert train_cli.main(["--config", str(cfg), "--no-progress"]) == 0
    best = (tmp_path / "w" / "checkpoints" / "best").resolve()
    weights = best / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert evaluate_cli.main(["--checkpoint", str(best), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert str(weights) in err and err.count("\n") == 1 and not (tmp_path / "r.json").exists()


def _png_header(path: Path, width: int, height: int) -> Path:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))
    return path


def test_a_decompression_bomb_is_a_named_error(tiny_world, tmp_path, capsys):
    root = tmp_path / "imgs"
    root.mkdir()
    _png_header(root / "bomb.png", 50000, 50000)
    dataset = tmp_path / "d.json"
    dataset.write_text(json.dumps({"images": [{"imgid": 7, "filename": "bomb.png", "split": "val",
                                               "sentences": [{"raw": "a bomb"}]}]}))
    assert extract_cli.main(["--dataset", str(dataset), "--images-root", str(root), "--out",
                             str(tmp_path / "f.h5"), "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert "error: image id 7" in err and "bomb.png" in err and "decompression bomb" in err
    assert "Traceback" not in err and not (tmp_path / "f.h5").exists()


@pytest.mark.parametrize("content,needle", [
    (None, "is a directory"),
    (b"run:\n  name: \xff\xfe\n", "not UTF-8"),
    (b"inherit: 123\n", "'inherit' must name a YAML file"),
    (b"a: &a [1, 2]\nb: [*a, *a]\n", "YAML aliases are not allowed"),
])
def test_bad_config_files_are_config_errors(tmp_path, content, needle):
    from captioner.train_config import TrainConfig

    path = tmp_path / "cfg.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=needle):
        load_config(TrainConfig, path)


def test_a_yaml_bomb_is_refused_quickly_and_small(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    lines.append("run: {name: *a11}")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    code = ("import resource, sys; from captioner.train_config import TrainConfig; "
            "from plumbing.cli import config_from_args; "
            "from captioner import train; sys.exit(train.main(['--config', sys.argv[1]]))")
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 2 and "YAML aliases are not allowed" in result.stderr
    assert time.perf_counter() - start < 60


# --- config values -----------------------------------------------------------------------------


@pytest.mark.parametrize("override,needle", [
    ("data.batch_size=0", "data.batch_size must be at least 1"),
    ("data.batch_size=-4", "data.batch_size must be at least 1"),
    ("optim.lr=-0.1", "optim.lr must be greater than 0"),
    ("optim.lr=.nan", "optim.lr': must be a finite number"),
    ("train.epochs=0", "train.epochs must be at least 1"),
    ("model.dropout=1.5", "model.dropout must be at most 1"),
    ("scst.temperature=0", "scst.temperature must be greater than 0"),
])
def test_config_values_are_checked_with_the_key_named(tiny_data, tmp_path, capsys, override, needle):
    cfg = tiny_config(tiny_data, tmp_path, name="vals", train={"epochs": 1})
    assert train_cli.main(["--config", str(cfg), "--set", override]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "vals").exists()


# --- images ------------------------------------------------------------------------------------


def test_16_bit_and_palette_pngs_decode_like_their_8_bit_copies(tmp_path):
    rng = np.random.default_rng(0)
    gray8 = rng.integers(20, 230, size=(32, 32), dtype=np.uint8)
    Image.fromarray(gray8.astype(np.uint16) * 257).save(tmp_path / "g16.png")
    Image.fromarray(gray8).save(tmp_path / "g8.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I")
    rgb = np.asarray(open_rgb(tmp_path / "g16.png"), dtype=np.float64)
    ref = np.asarray(open_rgb(tmp_path / "g8.png"), dtype=np.float64)
    assert abs(rgb.mean() - ref.mean()) < 0.5 and np.abs(rgb - ref).max() <= 1
    color = rng.integers(0, 255, size=(32, 32, 3), dtype=np.uint8)
    Image.fromarray(color).convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(tmp_path / "p.png")
    paletted = np.asarray(open_rgb(tmp_path / "p.png"), dtype=np.float64)
    expected = np.asarray(Image.open(tmp_path / "p.png").convert("RGB"), dtype=np.float64)
    assert paletted.shape == (32, 32, 3) and np.array_equal(paletted, expected)


def test_a_symlink_out_of_the_images_root_is_refused_unless_allowed(tiny_world, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    Image.new("RGB", (64, 64), (200, 10, 10)).save(outside / "secret.png")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link.png").symlink_to(outside / "secret.png")
    dataset = tmp_path / "d.json"
    dataset.write_text(json.dumps({"images": [{"imgid": 3, "filename": "link.png", "split": "val",
                                               "sentences": [{"raw": "a red square"}]}]}))
    args = ["--dataset", str(dataset), "--images-root", str(root), "--out", str(tmp_path / "f.h5"), "--workers", "0"]
    assert extract_cli.main(args) == 2
    assert "image id 3" in capsys.readouterr().err and not (tmp_path / "f.h5").exists()
    assert extract_cli.main([*args, "--allow-outside-root"]) == 0


# --- scores ------------------------------------------------------------------------------------


def _score(tmp_path: Path, preds, refs, *extra: str) -> int:
    (tmp_path / "p.json").write_text(json.dumps(preds))
    (tmp_path / "r.json").write_text(json.dumps(refs))
    return score_cli.main(["--predictions", str(tmp_path / "p.json"), "--references", str(tmp_path / "r.json"),
                           "--metrics", "bleu_4,cider", "--out", str(tmp_path / "s.json"), *extra])


@pytest.mark.parametrize("refs,needle", [
    ({"5": []}, "image id 5 has an empty reference list"),
    ({"5": [None, "a dog"]}, "image id 5: every reference must be a string, got NoneType"),
    ({"5": [5]}, "got int"),
    ({"5": [{"x": 1}]}, "got dict"),
])
def test_bad_reference_items_are_errors_naming_the_id(tmp_path, capsys, refs, needle):
    assert _score(tmp_path, [{"image_id": 5, "caption": "a dog"}], refs) == 2
    assert needle in capsys.readouterr().err and not (tmp_path / "s.json").exists()


def test_unpredicted_references_warn_and_require_all_errs(tmp_path, capsys):
    refs = {"5": ["a dog runs"], "6": ["a cat sits"], "7": ["two birds"]}
    assert _score(tmp_path, [{"image_id": 5, "caption": "a dog"}], refs) == 0
    assert "2 image(s) with references" in capsys.readouterr().err
    json.loads((tmp_path / "s.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert _score(tmp_path, [{"image_id": 5, "caption": "a dog"}], refs, "--require-all") == 2


def test_json_is_never_written_with_nan(tmp_path):
    from plumbing.atomic import write_json
    from plumbing.errors import RlcapError

    with pytest.raises(RlcapError, match="non-finite"):
        write_json(tmp_path / "x.json", {"cider": float("nan")})
    assert not (tmp_path / "x.json").exists()


# --- SPICE and METEOR --------------------------------------------------------------------------


def test_spice_scores_are_matched_to_their_rows(monkeypatch):
    import pycocoevalcap.spice.spice as spice_module

    from rewards.text.spice import spice_scores

    class SortedSpice:  # what pycocoevalcap does: one result per key, in sorted-key order
        def compute_score(self, gts, res):
            keys = sorted(gts)
            return 0.5, [{"All": {"f": float(len(res[k][0]))}} for k in keys]

    monkeypatch.setattr(spice_module, "Spice", SortedSpice)
    ids = [30, 10, 20, 10]  # out of order, and two rows of one image
    captions = ["aaa", "b", "cc", "dddd"]
    _, items = spice_scores(ids, captions, [["r"]] * 4)
    assert items == [3.0, 1.0, 2.0, 4.0]


def test_a_java_failure_during_evaluation_is_skipped_and_training_goes_on(tiny_data, tmp_path, monkeypatch, capsys):
    import rewards.text.terms as text_terms

    class DeadMeteor:
        def compute(self, data):
            raise OSError(errno.EPIPE, "Broken pipe (the METEOR Java process ended)")

        def close(self):
            pass

    monkeypatch.setattr(text_terms, "MeteorMetric", DeadMeteor)
    monkeypatch.setattr(text_terms, "meteor_unavailable_reason", lambda: None)
    cfg = tiny_config(tiny_data, tmp_path, name="java", train={"epochs": 2},
                      eval={"metrics": ["bleu_4", "cider", "meteor"], "select_by": "cider"})
    assert train_cli.main(["--config", str(cfg), "--no-progress"]) == 0
    assert "skipped {'meteor': 'failed: [Errno 32] Broken pipe" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "java" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1] and all("meteor" not in r for r in records)


def test_load_errors_name_the_data_file(tmp_path):
    from plumbing.references import load_references

    (tmp_path / "r.json").write_text('{"1": ["ok"], "2": "not a list"}')
    with pytest.raises(DataError, match="r.json"):
        load_references(tmp_path / "r.json")


def test_a_clip_run_killed_between_its_log_and_its_state_logs_each_epoch_once(tiny_world, tmp_path, monkeypatch):
    from accelerate import Accelerator

    from rewards import train_clip

    real = Accelerator.save_state
    calls = {"n": 0}

    def killed_at_second(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # epoch 2 is logged, its state is not saved
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Accelerator, "save_state", killed_at_second)
    args = ["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
            "--out", str(tmp_path / "c.safetensors"), "--epochs", "3", "--set", "batch_size=16", "--set", "workers=0"]
    assert train_clip.main(args) == 130
    assert train_clip.main(args) == 0
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "c.metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3]


def test_a_log_line_cut_short_is_left_out_and_the_next_append_stands_alone(tmp_path, capsys):
    """An append cut short (no newline, not JSON) is no record: readers leave it out with a note, the
    next append drops it; a whole record that only lacks its newline is kept; any other bad line is
    an error naming the file and the line."""
    from captioner import select as select_cli
    from plumbing.atomic import append_line
    from plumbing.jsonl import read_jsonl

    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    append_line(log, '{"epoch": 0, "cider": 0.5}')
    with open(log, "ab") as fh:
        fh.write(b'{"epoch": 1, "cid')
    assert read_jsonl(log) == [{"epoch": 0, "cider": 0.5}]
    assert "metrics.jsonl: line 2 was cut short" in capsys.readouterr().err
    assert select_cli.main(["--run", str(log.parent), "--by", "cider"]) == 0
    append_line(log, '{"epoch": 1, "cider": 0.7}')
    with open(log, "ab") as fh:
        fh.write(b'{"epoch": 2, "cider": 0.6}')
    append_line(log, '{"epoch": 3, "cider": 0.4}')
    assert [r["epoch"] for r in read_jsonl(log)] == [0, 1, 2, 3]
    assert log.read_text().count("\n") == 4
    for bad, needle in (('{"epoch": 4, "cider": NaN}', "line 5 is not valid JSON"),
                        ("[4, 0.4]", "line 5 must be a JSON object, got list")):
        text = log.read_text()
        log.write_text(text + bad + "\n" + '{"epoch": 5}\n')
        assert select_cli.main(["--run", str(log.parent), "--by", "cider"]) == 2
        assert f"{log}: {needle}" in capsys.readouterr().err
        log.write_text(text)


def test_a_gpu_asked_for_where_none_is_visible_is_a_config_error(monkeypatch):
    """`--device cuda` on a CPU machine stops at once with the way out, not at the first tensor moved."""
    import torch

    from plumbing.device import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto").type == "cpu" and pick_device("cpu").type == "cpu"
    with pytest.raises(ConfigError, match="device 'cuda': 0 CUDA GPU"):
        pick_device("cuda")
    with pytest.raises(ConfigError, match="device 'gpu': not a device name"):
        pick_device("gpu")
