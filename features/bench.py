"""`python -m features.bench`: throughput of world generation and feature extraction.

Renders a small world, then extracts it with both backbones (`patches` and a randomly
initialised open_clip architecture, the same code path as pretrained weights), repeating each
measurement and reporting medians. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from features.extract import ExtractConfig, extract
from features.world.generate import WorldConfig, generate
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option


@dataclass
class FeaturesBenchConfig:
    images: int = option(1000, help="world images to render and extract", at_least=1)
    clip_images: int = option(96, help="images for the open_clip extraction", at_least=1)
    arch: str = option("ViT-B-32", help="open_clip architecture (random init)")
    repeats: int = option(3, help="repeats per measurement (medians are reported)", at_least=1)


def median_rate(fn: Callable[[int], None], items: int, repeats: int) -> dict:
    times = []
    for k in range(repeats):
        start = time.perf_counter()
        fn(k)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"images": items, "median_s": round(median, 4), "images_per_s": round(items / median, 1),
            "repeats": repeats}


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(FeaturesBenchConfig, "python -m features.bench", __doc__)
    args, _ = parse_config(FeaturesBenchConfig, parser, argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        def world(k: int) -> None:
            generate(WorldConfig(out=str(root / f"world{k}"), train=args.images, val=0, test=0, seed=k),
                     progress=False)

        result = {"bench": "features", "world": median_rate(world, args.images, args.repeats)}
        dataset = root / "world0" / "dataset.json"

        def patches(k: int) -> None:
            extract(ExtractConfig(dataset=str(dataset), images_root=str(root / "world0"),
                                  out=str(root / f"patches{k}.h5")), progress=False)

        result["extract_patches"] = median_rate(patches, args.images, args.repeats)
        small = root / "small.json"
        full = json.loads(dataset.read_text())
        small.write_text(json.dumps({"images": full["images"][: args.clip_images]}))

        def clip(k: int) -> None:
            extract(ExtractConfig(dataset=str(small), images_root=str(root / "world0"),
                                  backbone=f"open_clip:{args.arch}",
                                  out=str(root / f"clip{k}.h5"), embeds_out=str(root / f"emb{k}.h5"), batch_size=32),
                    progress=False)

        result[f"extract_open_clip_{args.arch}"] = median_rate(clip, args.clip_images, max(1, args.repeats - 1))
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key:28s} {value['images_per_s']:>9.1f} images/s  (median of {value['repeats']})")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
