"""`python -m rewards.swap_towers --teacher runs/demo/reward_models/world_clip.safetensors
--student runs/demo/reward_models/world_lclip.ckpt`

Which tower of a distilled student loses what its teacher reads. Scores the offline world's foils
(the rendered ones and those in the references' wording, as every recipe's end-of-run table does;
clip_s with its prefix) with four pairings of image and text tower: the teacher's own, the
student's own, the teacher's image tower with the student's text tower, and the student's image
tower with the teacher's text tower. The two towers embed into the same space (L_D matches them
there), so each cross pairing isolates one student tower: where "teacher image + student text"
falls to the student's figure, the text tower is the loss; where "student image + teacher text"
does, the image tower.

Prints one table per foil source (a row per pairing and caption length); the last line printed is
one JSON object; --out writes it too (atomically).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from features.clip_models.factory import clip_text_forward
from features.clip_models.lclip import LClipConfig, load_lclip
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.spec import WORLD_CLIP_ARCH
from features.clip_models.tokens import ClipTokenizer
from plumbing.cli import command, config_parser, parse_config, print_result
from plumbing.config import option
from plumbing.device import pick_device
from plumbing.errors import ConfigError
from plumbing.tables import format_table
from rewards.recipes.data import cache_pixels, embed_split_images, load_split
from rewards.recipes.feature_maps import image_side
from rewards.recipes.foil_report import build_foils, judge_split


@dataclass
class SwapTowersConfig:
    teacher: str = option("", help="the teacher's weights (.safetensors file or open_clip hub tag)")
    teacher_arch: str = option(WORLD_CLIP_ARCH, help="the teacher's open_clip architecture")
    student: str = option("", help="the student's DistillCLIP checkpoint (.ckpt), as rewards.distill_lclip writes it")
    world: str = option("runs/demo/world", help="the offline world's folder (dataset.json, scenes.json, images)")
    split: str = option("val", help="the split whose images are scored")
    max_images: int | None = option(None, help="score only the split's first N images")
    device: str = option("auto", help="auto (the GPU when present), cpu or cuda")
    workers: int = option(0, help="image-decoding workers", at_least=0)
    out: str | None = option(None, help="also write the JSON result here")


def swap(cfg: SwapTowersConfig) -> dict:
    if not cfg.teacher or not cfg.student:
        raise ConfigError("swap_towers needs --teacher (weights) and --student (a DistillCLIP checkpoint)")
    device = pick_device(cfg.device)
    loaded = load_open_clip(cfg.teacher_arch, cfg.teacher, device)
    teacher = loaded.model.eval()
    student = load_lclip(cfg.student).to(device).eval()
    _check_student(student.config, teacher, cfg)
    world = Path(cfg.world)
    split = load_split(str(world / "dataset.json"), str(world), cfg.split, cfg.max_images)
    cache_pixels(split, loaded.preprocess, 2048, cfg.workers)
    foils = build_foils(split, str(world / "scenes.json"))  # the same foils for every pairing
    images = {name: embed_split_images(encode, split, loaded.preprocess, device, cfg.workers)
              for name, encode in (("teacher", teacher.encode_image), ("student", student.encode_image))}
    texts = {"teacher": remembered(clip_text_forward(teacher)), "student": remembered(student.encode_text)}
    tokenizer = ClipTokenizer(int(teacher.context_length))
    pairings = []
    for image, text in (("teacher", "teacher"), ("student", "student"), ("teacher", "student"),
                        ("student", "teacher")):
        report = judge_split(foils, images[image], texts[text], tokenizer, "clip_s", device)
        pairings.append({"image": image, "text": text, "world_foils": report.rendered,
                         "reference_foils": report.references})
    return {"teacher": cfg.teacher, "student": cfg.student, "split": cfg.split, "pairings": pairings}


def remembered(encode: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A text tower, run once per distinct batch: it serves two of the four pairings, and judge_split
    feeds it the same token batches both times (keyed by content, so the outputs are the ones a second
    run would give, not a near copy)."""
    seen: dict[tuple, torch.Tensor] = {}

    def forward(batch: torch.Tensor) -> torch.Tensor:
        key = (tuple(batch.shape), str(batch.dtype), _digest(batch))
        if key not in seen:
            seen[key] = encode(batch)
        return seen[key]

    return forward


def _digest(batch: torch.Tensor) -> bytes:
    raw = batch.detach().contiguous().cpu().reshape(-1).view(torch.uint8)  # any dtype
    return hashlib.sha1(raw.numpy().tobytes()).digest()


def _check_student(student: LClipConfig, teacher: torch.nn.Module, cfg: SwapTowersConfig) -> None:
    """The cross pairings need one embedding space, one image size and one text context."""
    sizes = {"embedding size": (student.embed_dim, int(teacher.text_projection.shape[1])),
             "image size": (student.image_size, image_side(teacher.visual)),
             "text positions": (student.context_length, int(teacher.context_length))}
    for what, (own, teachers) in sizes.items():
        if own != teachers:
            raise ConfigError(f"{cfg.student}: {what} {own}, the teacher {cfg.teacher} has {teachers}: its towers "
                              "cannot be paired with this teacher's (is it a student of it?)")


def tables(result: dict) -> str:
    out = []
    for source, title in (("world_foils", "rendered foils"), ("reference_foils", "foils in the references' wording")):
        kinds = sorted({k for p in result["pairings"] for by_kind in p[source].values() for k in by_kind},
                       key=lambda k: (k in ("all", "mean"), k))
        rows = [[p["image"], p["text"], label, *(f"{by_kind.get(k, float('nan')):.3f}" for k in kinds)]
                for p in result["pairings"] for label, by_kind in p[source].items()]
        out.append(f"{title} ({result['split']}; clip_s; chance 0.5), by pairing of towers:\n"
                   + format_table(["image", "text", "captions", *kinds], rows))
    return "\n\n".join(out)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(SwapTowersConfig, "python -m rewards.swap_towers", __doc__)
    cfg, _ = parse_config(SwapTowersConfig, parser, argv)
    result = swap(cfg)
    print_result(tables(result), result, cfg.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
