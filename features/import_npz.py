"""`python -m features.import_npz`: reference-SCST-layout feature folders -> feats.h5.

The reference SCST codebase keeps one `<image_id>.npz` (key `feat`, [P, D]) per image for
grid/region features and one `<image_id>.npy` ([D]) for pooled ones. Region counts may differ
between images: att is padded to the largest P and `att_mask` marks the real regions. Without a
pooled folder, fc is the mean of each image's regions.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from tqdm import tqdm

from features.store import FeatureWriter
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import dump_config, option
from plumbing.errors import ConfigError, DataError
from plumbing.karpathy import load_dataset

BATCH = 256


@dataclass
class ImportConfig:
    att_dir: str = option("", help="folder of <image_id>.npz files with a 'feat' array [P, D]")
    fc_dir: str | None = option(None, help="folder of <image_id>.npy pooled features (default: mean of att)")
    dataset: str | None = option(None, help="Karpathy dataset.json: import exactly its images, in its order")
    out: str = option("", help="output feats.h5")
    backbone: str = option("imported-npz", help="name recorded as the features' backbone")
    dtype: str = option("float16", help="float16 or float32")


def npz_feat_shape(path: Path) -> tuple[int, ...]:
    """Shape of `feat` in an .npz, read from its header without loading the array."""
    try:
        with zipfile.ZipFile(path) as archive, archive.open("feat.npy") as fh:
            version = np.lib.format.read_magic(fh)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, _ = reader(fh)
    except KeyError:
        raise DataError(f"{path}: no 'feat' array in the .npz") from None
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise DataError(f"{path}: unreadable .npz: {exc}") from None
    if len(shape) != 2 or 0 in shape:
        raise DataError(f"{path}: 'feat' must be [regions, dim] with at least one region, got shape {shape}")
    return shape


def check_one_dim(paths: list[Path], shapes: list[tuple[int, ...]]) -> int:
    """The feature size every file shares; the first file that differs is named before anything is written."""
    dim = shapes[0][1]
    for path, shape in zip(paths, shapes, strict=True):
        if shape[1] != dim:
            raise DataError(f"{path}: feature dim {shape[1]}, but {paths[0].name} has {dim}")
    return dim


def finite(path: Path, array: np.ndarray) -> np.ndarray:
    if not np.isfinite(array).all():
        raise DataError(f"{path}: {int((~np.isfinite(array)).sum())} non-finite value(s) (NaN or inf)")
    return array


def image_ids_from(cfg: ImportConfig) -> list[int]:
    if cfg.dataset:
        return [e.image_id for e in load_dataset(cfg.dataset)]
    ids = []
    for path in sorted(Path(cfg.att_dir).glob("*.npz")):
        if not path.stem.isdigit():
            raise DataError(f"{path}: file names must be <image_id>.npz with an integer id")
        ids.append(int(path.stem))
    if not ids:
        raise DataError(f"{cfg.att_dir}: no <image_id>.npz files")
    return sorted(ids)


def read_one(cfg: ImportConfig, image_id: int, regions: int, fc_dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    path = Path(cfg.att_dir) / f"{image_id}.npz"
    try:
        with np.load(path, allow_pickle=False) as npz:
            feat = finite(path, np.asarray(npz["feat"], dtype=np.float32))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable 'feat': {exc}") from None
    att = np.zeros((regions, feat.shape[1]), dtype=np.float32)
    att[: len(feat)] = feat
    mask = np.zeros(regions, dtype=bool)
    mask[: len(feat)] = True
    fc = _read_fc(cfg, image_id, fc_dim) if cfg.fc_dir else feat.mean(axis=0)
    return att, mask, fc


def _read_fc(cfg: ImportConfig, image_id: int, dim: int | None = None) -> np.ndarray:
    """One pooled feature [D]; with `dim`, one of that size (the first file's)."""
    path = Path(cfg.fc_dir) / f"{image_id}.npy"
    if not path.is_file():
        raise DataError(f"image id {image_id}: pooled feature {path} not found")
    try:
        fc = np.asarray(np.load(path, allow_pickle=False), dtype=np.float32)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable .npy: {exc}") from None
    if fc.size == 0 or fc.size != max(fc.shape, default=0):
        raise DataError(f"{path}: a pooled feature must be one vector [D], got shape {fc.shape}")
    fc = fc.reshape(-1)
    if dim is not None and len(fc) != dim:
        raise DataError(f"{path}: pooled feature size {len(fc)}, but the first image's has {dim}")
    return finite(path, fc)


def already_imported(out: Path, backbone: str, digest: str) -> bool:
    """A finished file made from these same folder contents (names and sizes) by this importer."""
    if not out.is_file():
        return False
    with h5py.File(out, "r") as h5:
        return h5.attrs.get("fingerprint") == digest and h5.attrs.get("backbone") == backbone


def import_npz(cfg: ImportConfig, progress: bool = True) -> Path:
    if not cfg.att_dir or not cfg.out:
        raise ConfigError("import_npz needs 'att_dir' and 'out'")
    ids = image_ids_from(cfg)
    paths = [Path(cfg.att_dir) / f"{i}.npz" for i in ids]
    missing = [i for i, p in zip(ids, paths, strict=True) if not p.is_file()]
    if missing:
        raise DataError(f"{cfg.att_dir}: no .npz for {len(missing)} image id(s), e.g. {missing[:5]}")
    digest = hashlib.sha256(json.dumps([[p.name, p.stat().st_size] for p in paths]).encode()).hexdigest()[:16]
    if already_imported(Path(cfg.out), cfg.backbone, digest):
        if progress:
            print(f"{cfg.out} already holds these features ({len(ids)} images from {cfg.att_dir}); nothing to do")
        return Path(cfg.out)
    shapes = [npz_feat_shape(p) for p in tqdm(paths, desc="scan", unit="file", disable=not progress)]
    regions, dim = max(s[0] for s in shapes), check_one_dim(paths, shapes)
    fc_dim = _read_fc(cfg, ids[0]).shape[0] if cfg.fc_dir else dim
    writer = FeatureWriter(cfg.out, {"att": ((regions, dim), cfg.dtype), "att_mask": ((regions,), "bool"),
                                     "fc": ((fc_dim,), cfg.dtype)},
                           {"backbone": cfg.backbone, "fingerprint": digest, "image_size": 0})
    try:
        done = writer.done_ids()
        todo = [i for i in ids if i not in done]
        for start in tqdm(range(0, len(todo), BATCH), desc="import", unit="batch", disable=not progress):
            batch = todo[start:start + BATCH]
            rows = [read_one(cfg, i, regions, fc_dim) for i in batch]
            writer.append(batch, {"att": np.stack([r[0] for r in rows]).astype(cfg.dtype),
                                  "att_mask": np.stack([r[1] for r in rows]),
                                  "fc": np.stack([r[2] for r in rows]).astype(cfg.dtype)})
        writer.finish()
    finally:
        writer.close()
    dump_config(cfg, Path(cfg.out).with_suffix(".config.yaml"))
    return Path(cfg.out)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(ImportConfig, "python -m features.import_npz", __doc__)
    cfg, _ = parse_config(ImportConfig, parser, argv)
    out = import_npz(cfg)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
