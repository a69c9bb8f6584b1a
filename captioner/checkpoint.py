"""Run checkpoints: `checkpoints/epoch_<k>` (and `step_<n>` mid-epoch), with `last` and `best`
symlinks. Each is written under a temporary name and renamed when complete; weights are
safetensors and everything else loads with weights_only=True or is JSON/YAML."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from captioner.vocab import Vocab
from plumbing.atomic import write_json
from plumbing.cli import one_line
from plumbing.config import to_dict
from plumbing.errors import DataError, RlcapError

STATE_FILE = "trainer_state.json"
RNG_STATE = "random_states_{}.pkl"  # accelerate's name for each process's RNG state
# The tied output embedding is saved once; accelerate warns about it on every save.
logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)


@dataclass
class TrainerState:
    epoch: int = 0  # the epoch to run next (or the one in progress)
    step_in_epoch: int = 0  # batches of `epoch` already consumed
    global_step: int = 0  # optimizer steps so far
    loss_sum: float = 0.0  # the epoch in progress: sum of its batch losses over all processes so far
    loss_batches: int = 0  # ... and how many batches that sum holds
    reward_stats: dict = field(default_factory=dict)  # scst.normalize running_z statistics per reward
    stage: str = "xe"
    best_score: float | None = None
    best_epoch: int | None = None
    feat_dim: int = 0
    n_tokens: int = 0
    fc_dim: int = 0
    max_len: int = 0
    vocab_size: int = 0
    feats_backbone: str = ""  # how the features were made, so raw images can be captioned alike
    feats_fingerprint: str = ""
    feats_image_size: int = 0
    feats_dtype: str = ""


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(accelerator, run_dir: Path, tag: str, state: TrainerState, cfg, vocab: Vocab,
                    is_best: bool, keep_last: int) -> Path:
    """Called on every process (accelerate writes per-process RNG states); the main process
    finishes the directory and moves it into place."""
    root = checkpoint_dir(run_dir)
    tmp, final = root / f".{tag}.partial", root / tag
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json(tmp / STATE_FILE, asdict(state), indent=1)
        write_json(tmp / "vocab.json", vocab.to_json())
        (tmp / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _point(root / "last", tag)
        if is_best:
            _point(root / "best", tag)
        _prune(root, keep_last)
    accelerator.wait_for_everyone()
    return final


def _point(link: Path, tag: str) -> None:
    tmp = link.with_name(f".{link.name}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(tag)
    os.replace(tmp, link)  # atomic switch of the symlink


def _order(path: Path) -> tuple[int, int]:
    state = json.loads((path / STATE_FILE).read_text())
    return state["global_step"], state["epoch"]


def _prune(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    kept = {os.readlink(root / name) for name in ("last", "best") if (root / name).is_symlink()}
    saved = sorted((p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
                    and (p / STATE_FILE).exists()), key=_order)
    for path in saved[:-keep_last]:
        if path.name not in kept:
            shutil.rmtree(path)


def resolve_checkpoint(run_dir: Path, spec: str) -> Path:
    """'latest' -> the run's last checkpoint; anything else is a checkpoint directory."""
    path = checkpoint_dir(run_dir) / "last" if spec == "latest" else Path(spec)
    if not (path / STATE_FILE).exists():
        where = f"{checkpoint_dir(run_dir)}" if spec == "latest" else str(path)
        raise RlcapError(f"no checkpoint to resume at {where}")
    return path.resolve()


def finished_epochs(run_dir: Path) -> int:
    """The epochs a run has finished, by its last checkpoint (0 without one)."""
    last = checkpoint_dir(run_dir) / "last"
    return read_checkpoint(last)[0].epoch if last.exists() else 0


def read_checkpoint(path: Path) -> tuple[TrainerState, dict, Vocab]:
    try:
        state = TrainerState(**json.loads((path / STATE_FILE).read_text()))
        cfg = yaml.safe_load((path / "config.yaml").read_text())
    except (FileNotFoundError, json.JSONDecodeError, TypeError, yaml.YAMLError) as exc:
        raise DataError(f"{path}: not an rlcap checkpoint: {exc}") from None
    return state, upgrade_saved_config(cfg), Vocab.load(path / "vocab.json")


def upgrade_saved_config(cfg: dict) -> dict:
    """A checkpoint's config in today's keys, so checkpoints from earlier releases still load:
    `eval.decode: greedy|beam` became `eval.beam_size` alone (1 is greedy)."""
    evaluation = cfg.get("eval") if isinstance(cfg, dict) else None
    if isinstance(evaluation, dict) and "decode" in evaluation:
        if evaluation.pop("decode") == "greedy":
            evaluation["beam_size"] = 1
    return cfg


def load_weights(model, path: Path, what: str) -> None:
    """A checkpoint's model.safetensors into `model`; a missing, truncated or mismatched file is a
    DataError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    weights = path / "model.safetensors"
    if not weights.is_file():
        raise DataError(f"{what} {path}: no model.safetensors")
    try:
        load_model(model, str(weights))
    except SafetensorError as exc:
        raise DataError(f"{what} {weights}: corrupt or truncated safetensors file ({exc})") from None
    except RuntimeError as exc:
        raise DataError(f"{what} {path}: weights do not fit this model config: {exc}") from None


def check_state_files(path: Path, process_index: int, without_rng_state: bool = False) -> str | None:
    """Read every state file of a checkpoint before accelerate does. accelerate stops at the first file
    it cannot read with a message that names none, and goes on without a word when the RNG state does
    not load, which leaves the resumed run unable to repeat its draws. Here each file is read as
    accelerate will read it (safetensors, or torch.load with weights_only=True) and a failure is a
    DataError naming it; an unusable RNG state is allowed only with `without_rng_state`, and then the
    returned note says so (the run's log keeps it)."""
    own_rng = path / RNG_STATE.format(process_index)
    for file in sorted(path.iterdir()):
        if file.name.startswith("random_states_"):
            continue
        if file.suffix == ".safetensors":
            _read_safetensors(file)
        elif file.suffix in (".bin", ".pt", ".pkl"):
            _read_torch_state(file)
    try:
        if not own_rng.is_file():
            raise DataError(f"{own_rng}: missing; this checkpoint has no RNG state for process {process_index}")
        _read_torch_state(own_rng)
    except DataError as exc:
        if not without_rng_state:
            raise DataError(f"cannot resume reproducibly: {exc}; resume from another checkpoint, or go on without "
                            "the saved random state with --resume-without-rng-state (the run will not repeat the "
                            "draws it would have made)") from None
        return f"resumed from {path} without its RNG state ({exc}); from here the run's draws are not reproducible"
    return None


def _read_safetensors(file: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise DataError(f"{file}: corrupt or truncated safetensors file ({one_line(exc, 200)})") from None


def _read_torch_state(file: Path) -> None:
    import pickle

    from accelerate.utils import load

    try:
        load(str(file), map_location="cpu")
    except pickle.UnpicklingError as exc:
        if "weights_only" in str(exc) or "Weights only load failed" in str(exc):
            raise DataError(f"{file}: refused by the safe loader (torch.load weights_only=True): it holds objects "
                            "other than tensors and plain data, which are never unpickled here") from None
        raise DataError(f"{file}: corrupt or truncated state file ({one_line(exc, 200)})") from None
    except (EOFError, RuntimeError, ValueError, OSError, KeyError, AttributeError, IndexError) as exc:
        why = f"{type(exc).__name__}: {one_line(exc, 200)}"
        raise DataError(f"{file}: corrupt or truncated state file ({why})") from None


def config_differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(saved) | set(current))
    diffs = []
    for key in keys:
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: checkpoint {a!r}, now {b!r}")
    return diffs
