"""What the COCO rehearsal runs on, built offline: a COCO-shaped set and reward models at their real
sizes, in the file layouts users download, with random weights.

- `dataset_coco.json` in Karpathy's format: real COCO captions (features/coco_sample, 200 images of
  the 2014 val set, CC BY 4.0), split train / restval / val / test, with COCO's file names;
- JPEG images at COCO's sizes (640 on the long side), generated;
- bottom-up region features in the reference SCST layout (`<id>.npz` with `feat` [10–100, 2048],
  `<id>.npy` [2048]);
- weights: open_clip RN50 (the grid backbone) and ViT-B-32 (CLIP-S) state dicts as `.safetensors`,
  SPECS's LongCLIP-B `spec.pt` (OpenAI key names, both position tables, 248 positions) and an L-CLIP
  student at the paper's size in a DistillCLIP Lightning `.ckpt`.

Everything is seeded; a set already built is kept (a `built.json` written last marks it whole).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from plumbing.atomic import write_json
from plumbing.staged import staged_folder

COCO_SIZES = [(640, 480), (480, 640), (640, 427), (500, 375), (640, 360), (427, 640), (612, 612)]
BOTTOM_UP_DIM = 2048


@dataclass
class RehearsalSet:
    root: Path

    @property
    def dataset(self) -> Path:
        return self.root / "dataset_coco.json"

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def bottomup_att(self) -> Path:
        return self.root / "cocobu_att"

    @property
    def bottomup_fc(self) -> Path:
        return self.root / "cocobu_fc"

    def weights(self, name: str) -> Path:
        return self.root / "weights" / name


def sample_captions(limit: int | None = None) -> list[dict]:
    """[{"image_id", "captions"}] of the committed COCO sample."""
    text = resources.files("features").joinpath("coco_sample/captions.json").read_text(encoding="utf-8")
    entries = json.loads(text)
    return entries[:limit] if limit else entries


def build_rehearsal_set(root: str | Path, images: int = 200, seed: int = 0) -> RehearsalSet:
    """Build (or find built) the rehearsal's inputs under `root`."""
    found = RehearsalSet(Path(root))
    marker = found.root / "built.json"
    wanted = {"images": images, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return found
    with staged_folder(found.root) as stage:
        made = RehearsalSet(stage)
        entries = sample_captions(images)
        write_dataset(made, entries)
        rng = np.random.default_rng(seed)
        write_images(made, entries, rng)
        write_bottomup(made, entries, rng)
        write_reward_models(made, seed)
        write_json(stage / "built.json", wanted)  # last: the set is whole
    return found


def split_of(index: int, total: int) -> str:
    """Karpathy's proportions at this size: about 70% train, 10% restval, 10% val, 10% test."""
    share = index / total
    return "train" if share < 0.7 else "restval" if share < 0.8 else "val" if share < 0.9 else "test"


def write_dataset(made: RehearsalSet, entries: list[dict]) -> None:
    images = []
    for index, entry in enumerate(entries):
        image_id = int(entry["image_id"])
        images.append({
            "filepath": "val2014", "filename": f"COCO_val2014_{image_id:012d}.jpg", "imgid": index,
            "cocoid": image_id, "split": split_of(index, len(entries)),
            "sentences": [{"raw": c, "tokens": c.lower().split(), "imgid": index, "sentid": 10 * index + k}
                          for k, c in enumerate(entry["captions"])],
        })
    write_json(made.dataset, {"dataset": "coco", "images": images})


def write_images(made: RehearsalSet, entries: list[dict], rng: np.random.Generator) -> None:
    folder = made.images / "val2014"
    folder.mkdir(parents=True, exist_ok=True)
    for index, entry in enumerate(entries):
        width, height = COCO_SIZES[index % len(COCO_SIZES)]
        image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(0, 255, 3)))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(2, 6))):
            x0, y0 = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
            box = (x0, y0, x0 + int(rng.integers(30, width // 2)), y0 + int(rng.integers(30, height // 2)))
            fill = tuple(int(v) for v in rng.integers(0, 255, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
        image.save(folder / f"COCO_val2014_{int(entry['image_id']):012d}.jpg", quality=85)


def write_bottomup(made: RehearsalSet, entries: list[dict], rng: np.random.Generator) -> None:
    made.bottomup_att.mkdir(parents=True, exist_ok=True)
    made.bottomup_fc.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        regions = int(rng.integers(10, 101))  # the adaptive 10-100 boxes
        feat = np.abs(rng.standard_normal((regions, BOTTOM_UP_DIM), dtype=np.float32))
        np.savez(made.bottomup_att / f"{entry['image_id']}.npz", feat=feat)
        np.save(made.bottomup_fc / f"{entry['image_id']}.npy", feat.mean(axis=0))


def write_reward_models(made: RehearsalSet, seed: int) -> None:
    """Random-init models at their real sizes, saved as their published files are."""
    import open_clip
    from safetensors.torch import save_file

    from features.clip_models.lclip import LClip, LClipConfig, heads_entry
    from features.clip_models.longclip import stretch_state_dict

    (made.root / "weights").mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    for arch, name in (("RN50", "rn50.safetensors"), ("ViT-B-32", "vit_b_32.safetensors")):
        state = open_clip.create_model(arch).state_dict()
        save_file({k: v.contiguous() for k, v in state.items()}, str(made.weights(name)))
    openai_layout = open_clip.create_model("ViT-B-32-quickgelu").state_dict()  # LongCLIP-B starts from it
    spec = stretch_state_dict(openai_layout)
    spec["positional_embedding_res"] = spec["positional_embedding_res"] + 0.02 * torch.randn_like(
        spec["positional_embedding_res"])
    torch.save(spec, made.weights("spec.pt"))
    student = LClip(LClipConfig())
    torch.save({"epoch": 0, "global_step": 0, "pytorch-lightning_version": "2.1.0",
                "state_dict": {f"student.{k}": v for k, v in student.state_dict().items()},
                "hyper_parameters": heads_entry(student.config)}, made.weights("lclip.ckpt"))
