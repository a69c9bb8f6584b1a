"""Recipes hold a split's preprocessed images in memory when they fit: the same tensors, the same
weights, the same random stream; a split that is too large or has an unreadable image streams."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from features.clip_models.open_clip_models import load_open_clip
from features.images import open_rgb
from rewards import train_clip
from rewards.recipes.data import TextsDataset, cache_pixels, load_split, split_pixels
from tests.clip_fixtures import TINY_ARCH


@pytest.fixture(scope="module")
def transform():
    return load_open_clip(TINY_ARCH).preprocess


def test_cached_pixels_are_the_decoded_ones_and_leave_the_random_stream(tiny_world, transform):
    split = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train")
    torch.manual_seed(0)
    assert cache_pixels(split, transform, limit_mb=64, workers=0)
    after_cache = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after_cache, torch.rand(3))
    assert split.pixels.images.shape[0] == len(split)
    for row in (0, len(split) // 2, len(split) - 1):
        assert torch.equal(split_pixels(split, row, transform), transform(open_rgb(split.paths[row])))
    other = load_open_clip("world-clip-rn16").preprocess  # another transform reads from the files
    assert torch.equal(split_pixels(split, 0, other), other(open_rgb(split.paths[0])))
    views = TextsDataset(split, transform, lambda row, rng: ["a caption"], seed=0)[1]
    assert torch.equal(views[0].image, split.pixels.images[1])


def test_a_split_too_large_or_with_a_bad_image_streams(tiny_world, transform, tmp_path):
    split = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train")
    assert len(split) * transform(open_rgb(split.paths[0])).numel() * 4 > 2**20  # 40 images of 64 px: ~2 MB
    assert not cache_pixels(split, transform, limit_mb=1, workers=0) and split.pixels is None
    assert not cache_pixels(split, transform, limit_mb=0, workers=0) and split.pixels is None
    world = tmp_path / "world"
    shutil.copytree(tiny_world, world)
    broken = load_split(str(world / "dataset.json"), str(world), "train")
    Path(broken.paths[2]).write_bytes(b"not a png")
    assert not cache_pixels(broken, transform, limit_mb=64, workers=0) and broken.pixels is None
    view = TextsDataset(broken, transform, lambda row, rng: ["a caption"], seed=0)[2][0]
    assert view.image is None and f"image id {broken.image_ids[2]}" in view.error and broken.paths[2] in view.error


def test_a_cached_run_trains_the_weights_of_a_streamed_one(tiny_world, tmp_path):
    def run(out, cache_mb: int) -> dict:
        code = train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                                "--out", str(out), "--epochs", "2", "--set", "batch_size=16", "--set", "workers=0",
                                "--scenes", str(tiny_world / "scenes.json"), "--negatives", "world",
                                "--set", "world.vision_pretrain_epochs=1", "--set", f"image_cache_mb={cache_mb}"])
        assert code == 0
        return load_file(str(out))

    cached, streamed = run(tmp_path / "cached.safetensors", 64), run(tmp_path / "streamed.safetensors", 0)
    assert cached.keys() == streamed.keys()
    assert all(torch.equal(cached[k], streamed[k]) for k in cached)
