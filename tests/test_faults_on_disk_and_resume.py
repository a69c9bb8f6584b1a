"""Faults, second round: a disk that fills while HDF5 files are written, an overwrite that fails, a
checkpoint whose state files do not load, list flags given twice, captions that tokenise to nothing."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import h5py
import pytest

from captioner import prepro as prepro_cli
from captioner import train as train_cli
from features import extract as extract_cli
from features.world import generate as world_cli
from plumbing.cli import config_parser, parse_config
from plumbing.config import option
from tests.captioner_fixtures import prepare_tiny_data, tiny_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_data(tiny_world, tmp_path_factory):
    return prepare_tiny_data(tiny_world, tmp_path_factory.mktemp("faultdata"))


# --- a disk that fills ---------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(root: Path, kilobytes: int):
    """A tmpfs of `kilobytes` mounted at a new folder under `root`; None where this process cannot mount."""
    where = root / f"disk-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    mounted = shutil.which("mount") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs", str(where)], capture_output=True).returncode == 0
    try:
        yield where if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("RLCAP_DEBUG", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def _one_named_line(done: subprocess.CompletedProcess, where: Path) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])  # a segfault is -11, a core dump 139
    errors = re.findall(r"error: [^\r\n]*", done.stderr)  # a progress bar may share its line
    assert len(errors) == 1 and "no space left on the device while writing" in errors[0], done.stderr[-2000:]
    assert str(where) in errors[0] and "Traceback" not in done.stderr and "RuntimeError" not in done.stderr


def _set_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_a_disk_that_fills_during_prepro_is_one_named_line(tiny_world, tmp_path):
    full_size = _set_size(Path(prepro_cli.prepro(prepro_cli.PreproConfig(
        dataset=str(tiny_world / "dataset.json"), out=str(tmp_path / "whole"), min_count=1))))
    for share in (0.2, 0.7):
        with small_disk(tmp_path, max(8, int(full_size * share / 1024))) as disk:
            if disk is None:
                pytest.skip("cannot mount a tmpfs here (not root); the writers' own checks are tested below")
            done = _run("captioner.prepro", "--dataset", str(tiny_world / "dataset.json"), "--out",
                        str(disk / "data"), "--min-count", "1")
            _one_named_line(done, disk)
            assert not (disk / "data").exists()  # nothing half-made under the final name


def test_a_disk_that_fills_during_extract_is_one_named_line_and_publishes_nothing(tiny_world, tmp_path):
    for kilobytes in (64, 1000):  # the tiny world's patches are about 1.6 MB
        with small_disk(tmp_path, kilobytes) as disk:
            if disk is None:
                pytest.skip("cannot mount a tmpfs here (not root); the writers' own checks are tested below")
            done = _run("features.extract", "--dataset", str(tiny_world / "dataset.json"), "--images-root",
                        str(tiny_world), "--out", str(disk / "feats.h5"), "--workers", "0", "--batch-size", "16")
            _one_named_line(done, disk / "feats.h5.partial")
            assert not (disk / "feats.h5").exists()


def test_the_feature_writer_checks_the_space_before_hdf5_writes(tiny_world, tmp_path, monkeypatch, capsys):
    from plumbing import atomic

    checks = []

    def filling(path):  # room for the file and two batches, then 300 kB
        checks.append(path)
        return shutil._ntuple_diskusage(10**9, 10**9, 4_000_000 if len(checks) <= 3 else 300_000)

    monkeypatch.setattr(atomic.shutil, "disk_usage", filling)
    assert extract_cli.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                             "--out", str(tmp_path / "feats.h5"), "--workers", "0", "--batch-size", "16"]) == 2
    err = capsys.readouterr().err
    assert f"while writing {tmp_path / 'feats.h5.partial'}; about" in err and "bytes more are needed" in err
    monkeypatch.undo()
    with h5py.File(tmp_path / "feats.h5.partial", "r") as h5:  # still whole, and resumed from
        assert h5["image_ids"].shape[0] == 32
    assert extract_cli.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                             "--out", str(tmp_path / "feats.h5"), "--workers", "0", "--batch-size", "16"]) == 0
    with h5py.File(tmp_path / "feats.h5", "r") as h5:
        assert h5["image_ids"].shape[0] == 64


def test_hdf5_meeting_a_full_disk_anyway_removes_its_file_and_names_it(tiny_world, tmp_path, monkeypatch, capsys):
    written = []

    def full(self, key, value):
        written.append(key)
        if len(written) > 3:
            raise OSError(errno.ENOSPC, "Can't synchronously write data (file write failed: errno = 28, error "
                          "message = 'No space left on device')")
        return original(self, key, value)

    original = h5py.Dataset.__setitem__
    monkeypatch.setattr(h5py.Dataset, "__setitem__", full)
    assert extract_cli.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                             "--out", str(tmp_path / "feats.h5"), "--workers", "0", "--batch-size", "16"]) == 2
    assert f"no space left on the device while writing {tmp_path / 'feats.h5.partial'}" in capsys.readouterr().err
    assert not (tmp_path / "feats.h5").exists() and not (tmp_path / "feats.h5.partial").exists()


# --- an overwrite that fails keeps the finished set -----------------------------------------------


def _files(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_a_failed_prepro_overwrite_leaves_the_earlier_set_as_it_was(tiny_world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "data"
    args = ["--dataset", str(tiny_world / "dataset.json"), "--out", str(out), "--min-count", "1", "--max-len", "12"]
    assert prepro_cli.main(args) == 0
    (out / "notes.txt").write_text("mine")  # a user's file beside the set
    before = _files(out)

    def full(path, *rest):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(prepro_cli, "save_df", full)  # labels, vocabulary and references are rewritten by then
    assert prepro_cli.main([*args[:-1], "7", "--force"]) == 2
    monkeypatch.undo()
    assert "no space left on the device" in capsys.readouterr().err
    assert _files(out) == before and not Path(f"{out}.partial").exists()
    assert prepro_cli.main(args) == 0 and "up to date" in capsys.readouterr().out
    assert prepro_cli.main([*args[:-1], "7", "--force"]) == 0  # a rebuild that succeeds replaces it whole
    assert (out / "notes.txt").read_text() == "mine"
    with h5py.File(out / "labels.h5") as h5:
        assert int(h5.attrs["max_len"]) == 7


def test_a_failed_overwrite_on_a_full_disk_keeps_the_earlier_set(tiny_world, tmp_path):
    whole = Path(prepro_cli.prepro(prepro_cli.PreproConfig(dataset=str(tiny_world / "dataset.json"),
                                                           out=str(tmp_path / "whole"), min_count=1)))
    with small_disk(tmp_path, int(_set_size(whole) * 1.5 / 1024)) as disk:  # room for one set, not two
        if disk is None:
            pytest.skip("cannot mount a tmpfs here (not root)")
        args = ["--dataset", str(tiny_world / "dataset.json"), "--out", str(disk / "data"), "--min-count", "1"]
        assert _run("captioner.prepro", *args).returncode == 0
        before = _files(disk / "data")
        _one_named_line(_run("captioner.prepro", *args, "--force", "--max-len", "9"), disk)
        assert _files(disk / "data") == before
        assert "up to date" in _run("captioner.prepro", *args).stdout


def test_a_killed_world_overwrite_leaves_the_earlier_world(tmp_path, monkeypatch):
    out = tmp_path / "world"
    args = ["--out", str(out), "--train", "6", "--val", "2", "--test", "2", "--seed", "1", "--workers", "1"]
    assert world_cli.main(args) == 0
    before = _files(out)

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(world_cli, "dump_config", killed)  # every image of the new world written by then
    assert world_cli.main([*args[:-3], "2", "--workers", "1", "--force"]) == 130
    monkeypatch.undo()
    assert _files(out) == before and world_cli.is_complete(world_cli.WorldConfig(
        out=str(out), train=6, val=2, test=2, seed=1, workers=1))


def test_a_swap_cut_between_its_two_renames_is_put_back(tmp_path):
    from plumbing.staged import previous_path, recover

    final = tmp_path / "data"
    previous_path(final).mkdir()
    (previous_path(final) / "labels.h5").write_text("old")
    recover(final)  # killed after parking the old folder, before the new one arrived
    assert (final / "labels.h5").read_text() == "old" and not previous_path(final).exists()


# --- resuming from a checkpoint whose state files do not load ------------------------------------


@pytest.fixture()
def one_epoch(tiny_data, tmp_path):
    cfg = tiny_config(tiny_data, tmp_path, name="resumed", train={"epochs": 1})
    assert train_cli.main(["--config", str(cfg), "--no-progress"]) == 0
    return cfg, (tmp_path / "resumed" / "checkpoints" / "last").resolve()


class _RunsCode:
    def __reduce__(self):
        return (os.getpid, ())


@pytest.mark.parametrize("damage,needle", [
    (lambda f: f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2]), "corrupt or truncated state file"),
    (lambda f: f.write_bytes(pickle.dumps({"random_state": _RunsCode()})), "refused by the safe loader"),
    (lambda f: f.unlink(), "missing"),
])
def test_an_unusable_rng_state_is_refused_naming_the_file_unless_asked(one_epoch, capsys, damage, needle):
    cfg, ckpt = one_epoch
    rng = ckpt / "random_states_0.pkl"
    damage(rng)
    resume = ["--config", str(cfg), "--no-progress", "--resume", "latest", "--set", "train.epochs=2"]
    assert train_cli.main(resume) == 2
    err = capsys.readouterr().err
    assert str(rng) in err and needle in err and "--resume-without-rng-state" in err
    assert train_cli.main([*resume, "--resume-without-rng-state"]) == 0
    assert "without its RNG state" in capsys.readouterr().err
    records = [json.loads(line) for line in (ckpt.parents[1] / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1]
    assert "resume_note" not in records[0] and str(rng) in records[1]["resume_note"]


@pytest.mark.parametrize("name", ["optimizer.bin", "scheduler.bin", "model.safetensors"])
def test_a_truncated_checkpoint_file_is_named(one_epoch, capsys, name):
    cfg, ckpt = one_epoch
    data = (ckpt / name).read_bytes()
    (ckpt / name).write_bytes(data[: len(data) // 2])
    assert train_cli.main(["--config", str(cfg), "--no-progress", "--resume", "latest", "--set",
                           "train.epochs=2"]) == 2
    err = capsys.readouterr().err
    assert str(ckpt / name) in err and "corrupt or truncated" in err


# --- list flags given twice ------------------------------------------------------------------------


@dataclass
class _Lists:
    images: list[str] = option(factory=list, help="files")
    sizes: list[int] = option(factory=list, help="numbers")
    metrics: str = option("all", help="a comma list", comma_list=True)
    name: str = option("x", help="one name")


def test_a_list_flag_given_twice_keeps_every_value():
    parser = config_parser(_Lists, "prog")
    cfg, _ = parse_config(_Lists, parser, ["--images", "a", "--images", "b,c", "--sizes", "1", "--sizes", "2",
                                           "--metrics", "bleu_4", "--metrics", "cider,specs", "--name", "y"])
    assert cfg.images == ["a", "b", "c"] and cfg.sizes == [1, 2] and cfg.metrics == "bleu_4,cider,specs"
    assert parse_config(_Lists, parser, ["--images", "a,b"])[0].images == ["a", "b"]


def test_score_with_reward_model_given_twice_scores_both(tiny_world, tmp_path):
    from rewards import score as score_cli
    from tests.clip_fixtures import TINY_ARCH, save_longclip, save_open_clip

    images = json.loads((tiny_world / "dataset.json").read_text())["images"]
    test = [im for im in images if im["split"] == "test"]
    predictions = tmp_path / "p.json"
    predictions.write_text(json.dumps([{"image_id": im["imgid"], "caption": im["sentences"][0]["raw"]}
                                       for im in test]))
    clip, spec = save_open_clip(tmp_path / "clip.safetensors"), save_longclip(tmp_path / "spec.pt")
    out = tmp_path / "s.json"
    assert score_cli.main(["--predictions", str(predictions), "--images", str(tiny_world / "images"),
                           "--reward-model", f"clip=open_clip:{TINY_ARCH}:{clip}", "--reward-model",
                           f"specs=longclip:{spec}", "--metrics", "clip_s", "--metrics", "specs",
                           "--embeds-cache", str(tmp_path / "cache"), "--out", str(out)]) == 0
    scores = json.loads(out.read_text())
    assert set(scores["corpus"]) == {"clip_s", "specs"} and scores["skipped"] == {}


# --- captions that tokenise to nothing -------------------------------------------------------------


def _dataset(path: Path, captions: dict[int, list[str]], splits: dict[int, str]) -> Path:
    images = [{"imgid": k, "filename": f"{k}.png", "split": splits.get(k, "train"),
               "sentences": [{"raw": c} for c in caps]} for k, caps in captions.items()]
    path.write_text(json.dumps({"images": images}))
    return path


def test_punctuation_only_captions_are_counted_named_and_dropped(tmp_path, capsys):
    captions = {k: ["a red circle", "a blue square"] for k in range(6)}
    captions[4] = ["a red circle", "... ! ,"]  # what the Java tokenizer also empties
    captions[5] = ["!", "--"]
    dataset = _dataset(tmp_path / "d.json", captions, {0: "val"})
    assert prepro_cli.main(["--dataset", str(dataset), "--out", str(tmp_path / "out"), "--min-count", "1"]) == 0
    err = capsys.readouterr().err
    assert "dropped 3 caption(s) with no words after tokenisation" in err and "from 2 image(s), ids 4, 5" in err
    assert "1 image(s) have no caption left" in err and "ids 5" in err
    refs = json.loads((tmp_path / "out" / "refs.json").read_text())
    assert refs["4"] == ["a red circle"] and "5" not in refs
    with h5py.File(tmp_path / "out" / "labels.h5") as h5:
        assert list(h5["image_ids"][:]) == [0, 1, 2, 3, 4] and int(h5["label_length"][:].min()) > 0
        assert int(h5["label_end_ix"][4] - h5["label_start_ix"][4]) == 0  # one caption left for image 4


def test_a_split_left_without_captions_is_an_error(tmp_path, capsys):
    dataset = _dataset(tmp_path / "d.json", {0: ["a red circle"], 1: ["...", "!"]}, {1: "val"})
    assert prepro_cli.main(["--dataset", str(dataset), "--out", str(tmp_path / "out"), "--min-count", "1"]) == 2
    err = capsys.readouterr().err
    assert "every image of split 'val' has only captions with no words" in err and "[1]" in err
    assert not (tmp_path / "out").exists()
