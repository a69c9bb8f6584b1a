"""`python -m rewards.probe_relations --weights runs/demo/reward_models/world_clip.safetensors`

Where a CLIP trained on the offline world loses spatial relations, and which other facts of a scene
its image embedding still holds. Prints three tables, the first two split by axis (horizontal: left
of / right of; vertical: above / below):

  relation foils   the world's rendered relation foils on --split, short and long: accuracy (chance
                   0.5) and the mean cosine between the true caption's and the foil's text embeddings
                   (near 1: the text tower hardly tells the relation words apart); captions
                   open with CLIP-S's "A photo depicts ", or --caption-prefix ('' as SPECS reads them);
  positions        a ridge readout from the image embedding alone to the centre of every shape
                   (colour) unique in its scene, fitted on --fit-split, read on --split: R² and how
                   often it orders two objects as the scene does;
  relations        the best a text tower could read from the image embedding: one vector per colour
                   and per shape named, "A above B" scored by e · (u_A - u_B), fitted by ridge on
                   --fit-split's object pairs and read on --split's (rewards.recipes.relation_probe);
  scene facts      the same kind of readout onto the background, the object count, and a one-object
                   scene's size and texture: accuracy beside the share of the commonest value;
  foil directions  how much of each rendered foil kind's text difference (true caption minus foil)
                   lies in the top 8 / 16 / 32 / 64 principal directions of --fit-split's image
                   embeddings, beside the images' own variance there: a kind that differs where the
                   images hardly vary is one a distilled student learns last (docs/lab_book.md,
                   "The student's quiet directions").

Positions read well, and relations read well by the fitted vectors, with foils at chance put the
loss in the text tower. The last line printed is one JSON object; --out writes it too (atomically).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from features.clip_models.factory import clip_text_forward
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.spec import WORLD_CLIP_ARCH
from features.clip_models.tokens import ClipTokenizer
from features.world.scene import load_scenes
from plumbing.cli import command, config_parser, parse_config, print_result
from plumbing.config import option
from plumbing.device import pick_device
from plumbing.tables import format_table
from rewards.clip.formulas import CLIP_S_PREFIX
from rewards.recipes.data import Split, embed_split_images, load_split
from rewards.recipes.foil_report import judge_foils, split_foils
from rewards.recipes.relation_probe import (
    foil_directions,
    read_facts,
    read_positions,
    read_relations,
    relation_foils_by_axis,
)


@dataclass
class ProbeRelationsConfig:
    arch: str = option(WORLD_CLIP_ARCH, help="open_clip architecture of the model")
    weights: str | None = option(None, help="the model's weights (.safetensors file or open_clip hub tag; "
                                 "default: random init, a chance-level baseline)")
    world: str = option("runs/demo/world", help="the offline world's folder (dataset.json, scenes.json, images)")
    split: str = option("val", help="the split that is measured")
    fit_split: str = option("train", help="the split the position readout is fitted on")
    seed: int = option(0, help="random seed of the foils")
    caption_prefix: str | None = option(None, help="the opening put before every caption and foil of the relation "
                                        "foils, a space after it (default: CLIP-S's \"A photo depicts \"; '' reads "
                                        "them as SPECS does)")
    device: str = option("auto", help="auto (the GPU when present), cpu or cuda")
    workers: int = option(0, help="image-decoding workers", at_least=0)
    out: str | None = option(None, help="also write the JSON result here")


def probe(cfg: ProbeRelationsConfig) -> dict:
    device = pick_device(cfg.device)
    loaded = load_open_clip(cfg.arch, cfg.weights, device)
    model = loaded.model
    world = Path(cfg.world)
    scenes_path = world / "scenes.json"
    scenes = load_scenes(scenes_path)
    measured, fitted = (load_split(str(world / "dataset.json"), str(world), name)
                        for name in (cfg.split, cfg.fit_split))

    def embed(split: Split) -> torch.Tensor:
        return embed_split_images(model.encode_image, split, loaded.preprocess, device, cfg.workers).cpu()

    images = embed(measured)
    items = split_foils(measured, scenes, cfg.seed, str(scenes_path))
    prefix = CLIP_S_PREFIX if cfg.caption_prefix is None else opening(cfg.caption_prefix)
    judged = judge_foils(images, clip_text_forward(model), ClipTokenizer(int(model.context_length)), items,
                         "clip_s", device, prefix)
    scenes_of = [scenes[image_id] for image_id in measured.image_ids]
    fit_images, fit_scenes = embed(fitted), [scenes[i] for i in fitted.image_ids]
    return {"model": loaded.source, "split": cfg.split, "fit_split": cfg.fit_split, "caption_prefix": prefix,
            "relation_foils": relation_foils_by_axis(judged, scenes_of),
            "positions": read_positions(fit_images, fit_scenes, images, scenes_of),
            "relations": read_relations(fit_images, fit_scenes, images, scenes_of),
            "facts": read_facts(fit_images, fit_scenes, images, scenes_of),
            "foil_directions": foil_directions(fit_images, judged)}


def opening(prefix: str) -> str:
    """A prefix as a caption's opening: a YAML value or --set loses its trailing space, which would glue
    the prefix's last word to the caption's first."""
    return prefix if not prefix or prefix[-1].isspace() else prefix + " "


def tables(result: dict) -> str:
    foils = format_table(["captions", "axis", "foils", "accuracy", "cos(truth, foil)"],
                         [[r["captions"], r["axis"], r["foils"], f"{r['accuracy']:.3f}", f"{r['text_cosine']:.4f}"]
                          for r in result["relation_foils"]])
    positions = format_table(["axis", "R²", "order by shape (pairs)", "order by colour (pairs)"],
                             [[r["axis"], f"{r['r2']:.3f}", f"{r['order_by_shape']:.3f} ({r['pairs_by_shape']})",
                               f"{r['order_by_colour']:.3f} ({r['pairs_by_colour']})"] for r in result["positions"]])
    relations = format_table(["axis", "pairs", f"accuracy ({result['fit_split']})", "accuracy"],
                             [[r["axis"], r["pairs"], f"{r['fit_accuracy']:.3f}", f"{r['accuracy']:.3f}"]
                              for r in result["relations"]])
    facts = format_table(["fact", "images", "accuracy", "commonest value's share"],
                         [[r["fact"], r["images"], f"{r['accuracy']:.3f}", f"{r['majority']:.3f}"]
                          for r in result["facts"]])
    tops = list(result["foil_directions"][0]["shares"])
    directions = format_table(["texts", "kind", "n", *(f"top {k}" for k in tops)],
                              [[r["captions"], r["kind"], r["foils"], *(f"{r['shares'][k]:.3f}" for k in tops)]
                               for r in result["foil_directions"]])
    read = f"(fitted on {result['fit_split']}, read on {result['split']})"
    return (f"relation foils of {result['model']} ({result['split']}; clip_s, captions after "
            f"{result['caption_prefix']!r}; chance 0.5):\n{foils}\n\n"
            f"object centres read linearly from the image embedding {read}:\n{positions}\n\n"
            f"relations read from the image embedding by the best vectors per colour and shape {read}:\n"
            f"{relations}\n\n"
            f"scene facts read linearly from the image embedding {read}:\n{facts}\n\n"
            f"where foils differ against where {result['fit_split']} images vary: share in the image embeddings' "
            f"top principal directions (images: of their variance; a kind: of its text differences' energy):\n"
            f"{directions}")


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(ProbeRelationsConfig, "python -m rewards.probe_relations", __doc__)
    cfg, _ = parse_config(ProbeRelationsConfig, parser, argv)
    result = probe(cfg)
    print_result(tables(result), result, cfg.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
