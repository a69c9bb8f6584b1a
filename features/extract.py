"""`python -m features.extract`: images of a Karpathy dataset -> feats.h5 (+ reward embeddings).

feats.h5: image_ids [N], att [N, P, D] grid tokens, fc [N, D'] pooled; attrs backbone,
fingerprint (hash of the weights), image_size. With --embeds-out (open_clip backbones):
image_ids [N], image [N, d] L2-normalised, for the reward models' caches.
Resumable: an interrupted run leaves *.partial files and the next run skips the ids in them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.cli import add_config_args, command, config_from_args
from captioner.config import dump_config
from captioner.errors import ConfigError, DataError
from captioner.karpathy import load_dataset
from features.backbones import make_backbone
from features.images import ImageFiles, check_images_exist, collate
from features.store import FeatureWriter, check_identity


@dataclass
class ExtractConfig:
    dataset: str = ""
    images_root: str = ""
    backbone: str = "patches"
    pretrained: str | None = None
    out: str = ""
    embeds_out: str | None = None
    image_size: int = 64  # patches backbone only; open_clip uses its model's size
    patch: int = 8
    batch_size: int = 64
    workers: int = 2
    dtype: str = "float16"
    device: str = "auto"


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def extract(cfg: ExtractConfig, on_batch: Callable[[int], None] | None = None, progress: bool = True) -> Path:
    """Run (or resume) one extraction. `on_batch(n_written)` is called after each flushed batch."""
    _validate(cfg)
    entries = load_dataset(cfg.dataset)
    paths = check_images_exist(cfg.images_root, entries)
    backbone = make_backbone(cfg.backbone, cfg.pretrained, cfg.image_size, cfg.patch, pick_device(cfg.device))
    attrs = {"backbone": backbone.name, "fingerprint": backbone.fingerprint, "image_size": backbone.image_size,
             "dataset": str(cfg.dataset)}
    if _already_done(Path(cfg.out), attrs, cfg.embeds_out):
        if progress:
            print(f"{cfg.out} already holds these features ({backbone.name}); nothing to do")
        return Path(cfg.out)
    writers = _open_writers(cfg, backbone, attrs)
    try:
        done = _resume_point(writers)
        ids = [e.image_id for e in entries]
        todo = [row for row, image_id in enumerate(ids) if image_id not in done]
        loader = DataLoader(ImageFiles(paths, ids, todo, backbone.transform), batch_size=cfg.batch_size,
                            num_workers=cfg.workers, collate_fn=collate)
        bar = tqdm(total=len(ids), initial=len(ids) - len(todo), desc=f"extract {backbone.name}", unit="img",
                   disable=not progress)
        for rows, images, errors in loader:
            if errors:
                raise DataError(errors[0] + (f" (and {len(errors) - 1} more in this batch)" if len(errors) > 1 else ""))
            _write_batch(writers, backbone.encode(images), [ids[r] for r in rows], cfg.dtype)
            bar.update(len(rows))
            if on_batch is not None:
                on_batch(writers[0].count)
        bar.close()
        for writer in writers:
            writer.finish()
    finally:
        for writer in writers:
            writer.close()
    dump_config(cfg, Path(cfg.out).with_suffix(".config.yaml"))
    return Path(cfg.out)


def _validate(cfg: ExtractConfig) -> None:
    for key in ("dataset", "images_root", "out"):
        if not getattr(cfg, key):
            raise ConfigError(f"extract needs {key!r} (--{key.replace('_', '-')})")
    if cfg.dtype not in ("float16", "float32"):
        raise ConfigError(f"config key 'dtype': 'float16' or 'float32', got {cfg.dtype!r}")
    if cfg.batch_size < 1:
        raise ConfigError("config key 'batch_size': must be >= 1")


def _already_done(out: Path, attrs: dict, embeds_out: str | None) -> bool:
    """A finished file with the same backbone is kept; one from another backbone is an error."""
    if not out.exists():
        return False
    with h5py.File(out, "r") as h5:
        check_identity(h5, attrs, out)
    return embeds_out is None or Path(embeds_out).exists()


def _open_writers(cfg: ExtractConfig, backbone, attrs: dict) -> list[FeatureWriter]:
    columns = {"att": (backbone.att_shape, cfg.dtype), "fc": ((backbone.fc_dim,), cfg.dtype)}
    writers = [FeatureWriter(cfg.out, columns, attrs)]
    if cfg.embeds_out:
        if not backbone.has_embed:
            raise ConfigError(f"--embeds-out needs an open_clip backbone; {backbone.name} has no image embedding")
        writers.append(FeatureWriter(cfg.embeds_out, {"image": ((backbone.embed_dim,), "float32")},
                                     {**attrs, "model": backbone.name, "normalized": True}))
    return writers


def _resume_point(writers: list[FeatureWriter]) -> set[int]:
    common = min(w.count for w in writers)
    for writer in writers:
        writer.truncate(common)
    return writers[0].done_ids()


def _write_batch(writers: list[FeatureWriter], enc, image_ids: list[int], dtype: str) -> None:
    writers[0].append(image_ids, {"att": enc.att.float().cpu().numpy().astype(dtype),
                                  "fc": enc.fc.float().cpu().numpy().astype(dtype)})
    if len(writers) > 1:
        writers[1].append(image_ids, {"image": enc.embed.float().cpu().numpy().astype(np.float32)})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m features.extract",
        description="Extract captioner features (and reward-model image embeddings) into HDF5. "
        "Resumable: re-run the same command after an interruption.",
    )
    parser.add_argument("--dataset", help="Karpathy-format dataset.json")
    parser.add_argument("--images-root", help="folder that filepath/filename entries are relative to")
    parser.add_argument("--backbone", help="'patches' (no weights) or 'open_clip:<arch>', e.g. open_clip:ViT-B-32")
    parser.add_argument("--pretrained", help="open_clip weights: a local file (.pt/.safetensors) or a hub tag")
    parser.add_argument("--out", help="output feats.h5")
    parser.add_argument("--embeds-out", help="also write L2-normalised image embeddings here (open_clip only)")
    parser.add_argument("--image-size", type=int, help="patches backbone: resize images to this side (default 64)")
    parser.add_argument("--patch", type=int, help="patches backbone: patch side in pixels (default 8)")
    parser.add_argument("--batch-size", type=int, help="images per batch (default 64)")
    parser.add_argument("--workers", type=int, help="DataLoader workers (default 2)")
    parser.add_argument("--device", help="auto (GPU when present), cpu or cuda")
    add_config_args(parser)
    return parser


@command
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    flags = {k: getattr(args, k) for k in ("dataset", "images_root", "backbone", "pretrained", "out", "embeds_out",
                                            "image_size", "patch", "batch_size", "workers", "device")}
    cfg = config_from_args(ExtractConfig, args, flags)
    out = extract(cfg)
    with h5py.File(out, "r") as h5:
        summary = {"out": str(out), "images": int(h5["image_ids"].shape[0]), "att": list(h5["att"].shape[1:]),
                   "backbone": h5.attrs["backbone"]}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
