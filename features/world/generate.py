"""`python -m features.world`: render the offline shapes world.

Writes, under --out: images/*.png, dataset.json (Karpathy format, with each image's long
detailed caption and its detail units), scenes.json (the ground-truth scene graph) and
world_config.yaml (the resolved config). dataset.json is written last, so its presence means
the world is complete; a re-run with the same config finds it and does nothing.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np
import yaml
from tqdm import tqdm

from features.world.captions import long_caption_units, short_captions
from features.world.render import render
from features.world.scene import sample_scene
from plumbing.atomic import write_json
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import dump_config, option, to_dict
from plumbing.errors import ConfigError
from plumbing.ptb import ptb_tokenize
from plumbing.staged import recover, staged_folder

SPLITS = ("train", "val", "test")
IMAGE_DIR = "images"


@dataclass
class WorldConfig:
    out: str = option("runs/world", help="output directory")
    train: int = option(4000, help="number of train images", at_least=0)
    val: int = option(500, help="number of val images", at_least=0)
    test: int = option(500, help="number of test images", at_least=0)
    seed: int = option(0, help="random seed; the same seed gives the same world, byte for byte")
    image_size: int = option(64, help="image side in pixels (32-1024)", at_least=32, at_most=1024)
    max_objects: int = option(4, help="objects per scene, at most (1-4)", at_least=1, at_most=4)
    workers: int = option(2, help="rendering processes", at_least=0)


def split_of(index: int, cfg: WorldConfig) -> str:
    if index < cfg.train:
        return "train"
    return "val" if index < cfg.train + cfg.val else "test"


def make_image(index: int, cfg: WorldConfig, images_dir: str) -> tuple[dict, dict]:
    """Sample, render and save image `index`; return its dataset entry and scene graph.

    Each image draws from its own generator seeded by (seed, index), so the result does not
    depend on how images are spread over worker processes.
    """
    rng = np.random.default_rng([cfg.seed, index])
    scene = sample_scene(rng, cfg.image_size, cfg.max_objects)
    image = render(scene, rng)
    filename = f"world_{index:06d}.png"
    tmp = os.path.join(images_dir, f".{filename}.partial")
    image.save(tmp, format="PNG")
    os.replace(tmp, os.path.join(images_dir, filename))
    units = long_caption_units(rng, scene)
    sentences = [
        {"raw": raw, "tokens": ptb_tokenize(raw).split(), "imgid": index, "sentid": index * 5 + k}
        for k, raw in enumerate(short_captions(rng, scene))
    ]
    entry = {
        "imgid": index, "filepath": IMAGE_DIR, "filename": filename, "split": split_of(index, cfg),
        "sentences": sentences, "sentids": [s["sentid"] for s in sentences],
        "long_captions": [{"raw": " ".join(units), "detail_units": units}],
    }
    return entry, scene.to_json()


def generate(cfg: WorldConfig, progress: bool = True) -> Path:
    _validate(cfg)
    out = Path(cfg.out)
    # built beside a finished world and swapped in whole, so that a failed --force keeps the old one
    with staged_folder(out) as stage:
        _generate_into(stage, cfg, progress)
    return out


def _generate_into(out: Path, cfg: WorldConfig, progress: bool) -> None:
    images_dir = out / IMAGE_DIR
    images_dir.mkdir(parents=True, exist_ok=True)
    total = cfg.train + cfg.val + cfg.test
    entries: list[dict] = []
    scenes: dict[str, dict] = {}
    chunk = max(1, min(256, total // (4 * max(1, cfg.workers)) or 1))
    with ProcessPoolExecutor(max_workers=cfg.workers) if cfg.workers > 1 else _Inline() as pool:
        results = pool.map(make_image, range(total), [cfg] * total, [str(images_dir)] * total, chunksize=chunk)
        for entry, scene in tqdm(results, total=total, desc="world", unit="img", disable=not progress):
            entries.append(entry)
            scenes[str(entry["imgid"])] = scene
    write_json(out / "scenes.json", {"image_size": cfg.image_size, "seed": cfg.seed, "images": scenes})
    dump_config(cfg, out / "world_config.yaml")
    write_json(out / "dataset.json", {"dataset": "rlcap-world", "images": entries})


def is_complete(cfg: WorldConfig) -> bool:
    """True when --out already holds a finished world made with this exact config."""
    out = Path(cfg.out)
    saved = out / "world_config.yaml"
    if not (out / "dataset.json").exists() or not saved.exists():
        return False
    return yaml.safe_load(saved.read_text()) == to_dict(cfg)


def _validate(cfg: WorldConfig) -> None:
    for key in SPLITS:
        if getattr(cfg, key) < 0:
            raise ConfigError(f"config key {key!r}: must be >= 0, got {getattr(cfg, key)}")
    if cfg.train + cfg.val + cfg.test == 0:
        raise ConfigError("the world needs at least one image (train + val + test > 0)")
    if cfg.image_size < 32:
        raise ConfigError(f"config key 'image_size': must be >= 32 so small objects stay visible, got {cfg.image_size}")
    if not 1 <= cfg.max_objects <= 4:
        raise ConfigError(f"config key 'max_objects': must be in 1..4, got {cfg.max_objects}")


class _Inline:
    """Stands in for a process pool when workers <= 1."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @staticmethod
    def map(fn, *iterables, chunksize: int = 1):
        return map(fn, *iterables)


def build_parser() -> argparse.ArgumentParser:
    parser = config_parser(WorldConfig, "python -m features.world", __doc__)
    parser.add_argument("--force", action="store_true", help="regenerate even if --out holds this world")
    return parser


@command
def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_config(WorldConfig, build_parser(), argv)
    if cfg.out:
        recover(Path(cfg.out))
    if not args.force and is_complete(cfg):
        print(f"world already complete in {cfg.out} (same config); nothing to do")
        return 0
    start = time.perf_counter()
    out = generate(cfg)
    total = cfg.train + cfg.val + cfg.test
    elapsed = time.perf_counter() - start
    print(f"wrote {total} images to {out} in {elapsed:.1f}s ({total / elapsed:.0f} images/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
