"""Safe weight loading: safetensors or torch.load(weights_only=True), never a user pickle."""

from __future__ import annotations

import hashlib
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch

from plumbing.errors import DataError

NESTING_KEYS = ("state_dict", "model", "module")


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a weights file (.safetensors, or a torch file loadable with weights_only=True)."""
    return unwrap_state_dict(load_weights_file(path), path)


def load_weights_file(path: str | Path) -> object:
    """A weights file's contents as saved (a checkpoint's wrapper dict kept), loaded safely."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: weights file not found")
    from safetensors import SafetensorError

    if is_torchscript(path):
        raise DataError(f"{path}: a TorchScript archive (as OpenAI's original CLIP .pt files are); rlcap does not "
                        "load code-bearing archives: use open_clip's hub tag (e.g. `openai`) for this architecture, "
                        "or that model's state_dict() saved as .safetensors")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's own message advises weights_only=False, which is the one thing rlcap never does
        raise DataError(f"{path}: cannot load weights safely: {_refusal_reason(path)}") from None
    except (OSError, RuntimeError, ValueError, EOFError, SafetensorError) as exc:
        raise DataError(f"{path}: cannot load weights safely (weights_only / safetensors): {exc}") from None
    return state


TORCH_FILE_STARTS = (b"PK\x03\x04", b"\x80")  # torch.save's zip archive; the legacy pickle format


def is_torchscript(path: Path) -> bool:
    """A torch.jit.save archive: a zip whose records hold the module's code (<name>/code/...)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any("/code/" in name or name.endswith("/constants.pkl") for name in archive.namelist())


def _refusal_reason(path: Path) -> str:
    with path.open("rb") as handle:
        start = handle.read(8)
    if not start.startswith(TORCH_FILE_STARTS):
        return f"not a torch or safetensors weights file (it starts with {start!r})"
    return ("it holds Python objects besides tensors, which rlcap does not unpickle; save its "
            "state_dict() with torch.save, or the tensors with safetensors")


def unwrap_state_dict(state: object, path: str | Path = "<memory>") -> dict[str, torch.Tensor]:
    """Accept {'state_dict': ...}-style wrappers and DDP 'module.' prefixes."""
    while isinstance(state, Mapping) and not _is_flat(state):
        inner = next((state[k] for k in NESTING_KEYS if k in state and isinstance(state[k], Mapping)), None)
        if inner is None:
            raise DataError(f"{path}: no tensor state dict found (top-level keys: {sorted(state)[:8]})")
        state = inner
    if not isinstance(state, Mapping):
        raise DataError(f"{path}: expected a state dict, got {type(state).__name__}")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return dict(state)


def _is_flat(state: Mapping) -> bool:
    return bool(state) and all(isinstance(v, torch.Tensor) for v in state.values())


def load_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str | Path) -> None:
    """Strict load whose error lists the missing and unexpected keys."""
    expected = set(model.state_dict())
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise DataError(
            f"{source}: checkpoint does not match the model: "
            f"missing keys {_few(missing)}; unexpected keys {_few(unexpected)}"
        )
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise DataError(f"{source}: checkpoint does not match the model: {exc}") from None


def fingerprint(model: torch.nn.Module, architecture: str = "") -> str:
    """A short hash of every parameter and buffer (and of `architecture`, for settings such as head
    counts that the weights alone do not fix): equal weights and settings, equal fingerprint."""
    digest = hashlib.sha256(architecture.encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _few(keys: list[str], limit: int = 8) -> str:
    if not keys:
        return "none"
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more
