"""`python -m features.extract`: images of a Karpathy dataset -> feats.h5 (+ reward embeddings).

feats.h5: image_ids [N], att [N, P, D] grid tokens, fc [N, D'] pooled; attrs backbone,
fingerprint (hash of the weights), image_size. With --embeds-out (open_clip, longclip, lclip):
image_ids [N], image [N, d] L2-normalised, for the reward models' caches.
Resumable: an interrupted run leaves *.partial files and the next run skips the ids in them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from torch.utils.data import DataLoader
from tqdm import tqdm

from features.backbones import Backbone, make_backbone
from features.images import ImageFiles, check_images_exist, collate
from features.store import FeatureWriter, check_identity
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import dump_config, option, require_keys
from plumbing.device import pick_device
from plumbing.errors import ConfigError, DataError
from plumbing.karpathy import load_dataset
from plumbing.locks import hold_lock


@dataclass
class ExtractConfig:
    dataset: str = option("", help="Karpathy-format dataset.json")
    images_root: str = option("", help="folder that filepath/filename entries are relative to")
    backbone: str = option("patches", help="'patches' (no weights), 'open_clip:<arch>' (e.g. open_clip:ViT-B-32), "
                           "or, for reward-model embeddings only, 'longclip' (SPECS) or 'lclip' (L-CLIP)")
    pretrained: str | None = option(None, help="weights: a local file (.pt/.safetensors/.ckpt); for open_clip also "
                                    "a hub tag")
    out: str = option("", help="output feats.h5 (captioner features)")
    embeds_out: str | None = option(None, help="write L2-normalised image embeddings here (embeds/<key>.h5)")
    image_size: int = option(64, help="patches backbone: resize images to this side (open_clip uses its model's)",
                             at_least=8)
    patch: int = option(8, help="patches backbone: patch side in pixels", at_least=1)
    batch_size: int = option(64, help="images per batch", at_least=1)
    workers: int = option(2, help="DataLoader workers", at_least=0)
    dtype: str = option("float16", help="float16 or float32 for feats.h5")
    device: str = option("auto", help="auto (the GPU when present), cpu or cuda")
    allow_outside_root: bool = option(False, help="follow image paths and symlinks that lead outside images_root")


def extract(cfg: ExtractConfig, on_batch: Callable[[int], None] | None = None, progress: bool = True,
            backbone: Backbone | None = None) -> Path:
    """Run (or resume) one extraction. `on_batch(n_written)` is called after each flushed batch;
    `backbone` is the one cfg names, when the caller has it built already."""
    _validate(cfg)
    entries = load_dataset(cfg.dataset)
    paths = check_images_exist(cfg.images_root, entries, cfg.allow_outside_root)
    if backbone is None:
        backbone = make_backbone(cfg.backbone, cfg.pretrained, cfg.image_size, cfg.patch, pick_device(cfg.device))
    attrs = {"backbone": backbone.name, "fingerprint": backbone.fingerprint, "image_size": backbone.image_size,
             "dataset": str(cfg.dataset)}
    main_out = Path(cfg.out or cfg.embeds_out)
    if _already_done(cfg, attrs):
        if progress:
            print(f"{main_out} already holds these features ({backbone.name}); nothing to do")
        return main_out
    hold_lock(main_out.with_name(main_out.name + ".lock"), f"extraction into {main_out}")
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
                on_batch(next(iter(writers.values())).count)
        bar.close()
        for writer in writers.values():
            writer.finish()
    finally:
        for writer in writers.values():
            writer.close()
    dump_config(cfg, main_out.with_suffix(".config.yaml"))
    return main_out


def _validate(cfg: ExtractConfig) -> None:
    require_keys(cfg, ("dataset", "images_root"), "extract")
    if not cfg.out and not cfg.embeds_out:
        raise ConfigError("extract needs 'out' (--out feats.h5) and/or 'embeds_out' (--embeds-out embeds/<key>.h5)")
    if cfg.dtype not in ("float16", "float32"):
        raise ConfigError(f"config key 'dtype': 'float16' or 'float32', got {cfg.dtype!r}")
    if cfg.batch_size < 1:
        raise ConfigError("config key 'batch_size': must be >= 1")


def _already_done(cfg: ExtractConfig, attrs: dict) -> bool:
    """Finished files from the same model are kept; one from another model is an error."""
    outputs = [Path(p) for p in (cfg.out, cfg.embeds_out) if p]
    for out in outputs:
        if out.exists():
            with h5py.File(out, "r") as h5:
                check_identity(h5, attrs, out)
    return all(out.exists() for out in outputs)


def _open_writers(cfg: ExtractConfig, backbone, attrs: dict) -> dict[str, FeatureWriter]:
    writers = {}
    if cfg.out:
        if not backbone.has_feats:
            raise ConfigError(f"backbone {backbone.name} gives image embeddings only: use --embeds-out, not --out")
        columns = {"att": (backbone.att_shape, cfg.dtype), "fc": ((backbone.fc_dim,), cfg.dtype)}
        writers["feats"] = FeatureWriter(cfg.out, columns, attrs)
    if cfg.embeds_out:
        if not backbone.has_embed:
            raise ConfigError(f"--embeds-out needs a CLIP-family backbone; {backbone.name} has no image embedding")
        writers["embeds"] = FeatureWriter(cfg.embeds_out, {"image": ((backbone.embed_dim,), "float32")},
                                          {**attrs, "model": backbone.name, "normalized": True})
    return writers


def _resume_point(writers: dict[str, FeatureWriter]) -> set[int]:
    common = min(w.count for w in writers.values())
    for writer in writers.values():
        writer.truncate(common)
    return next(iter(writers.values())).done_ids()


def _write_batch(writers: dict[str, FeatureWriter], enc, image_ids: list[int], dtype: str) -> None:
    if "feats" in writers:
        writers["feats"].append(image_ids, {"att": enc.att.float().cpu().numpy().astype(dtype),
                                            "fc": enc.fc.float().cpu().numpy().astype(dtype)})
    if "embeds" in writers:
        writers["embeds"].append(image_ids, {"image": enc.embed.float().cpu().numpy().astype(np.float32)})


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(ExtractConfig, "python -m features.extract", __doc__)
    cfg, _ = parse_config(ExtractConfig, parser, argv)
    out = extract(cfg)
    with h5py.File(out, "r") as h5:
        summary = {"out": str(out), "images": int(h5["image_ids"].shape[0]), "backbone": h5.attrs["backbone"],
                   "fingerprint": h5.attrs["fingerprint"]}
        summary.update({"att": list(h5["att"].shape[1:])} if "att" in h5 else {"embed_dim": int(h5["image"].shape[1])})
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
