"""Image embeddings of an arbitrary folder of images, computed on the fly and cached.

For scoring captions of images that come with no embeds file (`rewards.score --images DIR`):
the reward model embeds the images once, through the same extraction code as
`features.extract --embeds-out`, into `<cache>/<model fingerprint>/<digest of the files>.h5`. A
later call with the same model and the same files reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from features.backbones import make_backbone
from features.clip_models.spec import RewardModelSpec
from features.extract import ExtractConfig, extract
from plumbing.atomic import write_json
from plumbing.device import pick_device


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlcap" / "embeds"


def backbone_name(spec: RewardModelSpec) -> str:
    return f"open_clip:{spec.arch}" if spec.kind == "open_clip" else spec.kind


def files_digest(files: dict[int, Path]) -> str:
    """Which files, by id, at which size and time: a changed image is a new cache entry."""
    rows = [[image_id, str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns]
            for image_id, path in sorted(files.items())]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:20]


def cached_embeddings(spec: RewardModelSpec, files: dict[int, Path], cache_dir: Path, device: str = "auto",
                      workers: int = 2, progress: bool = True) -> Path:
    """The embeds file of `files` (image id -> path) under `spec`'s model; computed if not cached."""
    backbone = make_backbone(backbone_name(spec), spec.weights, device=pick_device(device))
    out = cache_dir / backbone.fingerprint / f"{files_digest(files)}.h5"
    if out.exists():
        return out
    root = Path(os.path.commonpath([str(p.resolve().parent) for p in files.values()]))
    listing = out.with_suffix(".dataset.json")
    write_json(listing, {"images": [
        {"imgid": image_id, "filename": str(path.resolve().relative_to(root)), "split": "test",
         "sentences": [{"raw": "-"}]} for image_id, path in sorted(files.items())]})
    cfg = ExtractConfig(dataset=str(listing), images_root=str(root), backbone=backbone_name(spec),
                        pretrained=spec.weights, embeds_out=str(out), workers=workers, device=device)
    return extract(cfg, progress=progress, backbone=backbone)
