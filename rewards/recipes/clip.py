"""Contrastive training of an open_clip architecture (by default `world-clip-tiny`, registered from
features/clip_models/model_configs, or any open_clip model from `init`) on a Karpathy-format dataset's
images with their short and long captions, optionally with hard text negatives (NegCLIP): each
caption edited by its words alone (`negatives: text`, any captions), or with one fact changed and
checked false against the world's scene graphs (`negatives: world`). What only the world can feed
sits in the `world:` section (rewards/recipes/clip_world.py).

It writes an open_clip state dict (safetensors) that loads through the same path as any user
checkpoint (`load_open_clip(arch, path)`), reports image->text / text->image R@1 on val each epoch
and, on the offline world, ends with its world-foil accuracy per kind. Data streams from the image
files (`accelerate launch -m rewards.train_clip` for several processes); an interrupted run
resumes from its last finished epoch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from features.clip_models.factory import clip_text_forward
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.text_batches import PrefixTree, prefix_tree
from features.clip_models.tokens import ClipTokenizer
from features.world.scene import Scene, load_world_scenes
from plumbing.atomic import write_json
from plumbing.config import option, require_keys
from plumbing.errors import ConfigError
from rewards.recipes.clip_world import (
    WorldSupervision,
    checked_negatives,
    counterfactual_images,
    groundings,
    kept_scene_labels,
    pretrain_vision,
    text_epochs,
    text_stage_plan,
    validate_world,
)
from rewards.recipes.contrastive import embed_texts, gather_with_grad, negclip_loss, recall_at_1
from rewards.recipes.data import (
    CaptionKind,
    Split,
    TextBatcher,
    TextsDataset,
    cache_pixels,
    embed_split_images,
    load_split,
    pick,
)
from rewards.recipes.foil_report import announce, foil_accuracy
from rewards.recipes.grounding import Grounding
from rewards.recipes.loop import PairEncoder, RecipeConfig, RecipeRun, Stage
from rewards.recipes.scene_labels import scene_label_loss
from rewards.recipes.text_negatives import check_text_edits, checked_text_editor, edit_summary
from rewards.recipes.text_stage import read_relations
from rewards.recipes.training import finished_summary, lock, save_weights, summary_record, unlock
from rewards.text.edits import KINDS as TEXT_EDITS
from rewards.text.edits import TextEditor

MAX_LOGIT_SCALE = math.log(100.0)


@dataclass
class TrainClipConfig(RecipeConfig):
    arch: str = option("world-clip-tiny", help="open_clip architecture (rlcap's world-clip-* or any open_clip name)")
    init: str | None = option(None, help="starting weights: a file or an open_clip hub tag (default: random init)")
    out: str = option("", help="output weights (.safetensors, open_clip state dict)")
    captions: CaptionKind = option("both", help="caption pool per image: short references, long captions or both")
    negatives: Literal["none", "world", "text"] = option(
        "none", help="hard text negatives: none; world (the caption with one fact changed, checked false against "
        "`scenes`); or text (the caption edited with no scene: a noun, adjective or number replaced, two swapped, "
        "a relation inverted, trigrams shuffled; any captions, COCO's too; rewards/text/edits.py)")
    hard_negatives: int = option(3, help="hard negatives per image and step (with negatives: text or world)",
                                 at_least=0)
    text_edits: list[str] = option(factory=lambda: list(TEXT_EDITS), help="negatives: text, the edits a negative may "
                                   "come from")
    lock_image_tower: bool = option(
        False, help="LiT: the contrastive stage trains the text tower and the temperature only, against an "
        "image tower kept as it starts (from `init` or vision_pretrain_epochs)")
    locked_image_epochs: int = option(
        0, help="the first of the contrastive `epochs` train the text tower and the temperature against the image "
        "tower as it starts (LiT, at a constant rate), then both towers train, so the text tower learns to read what "
        "the pretrained tower sees before the joint epochs move it (0: both towers from the start; on the world, "
        "three seeds of 1 disagreed: docs/lab_book.md)", at_least=0)
    pool_position_std: float | None = option(
        None, help="from scratch only: draw the ResNet attention pool's position embedding with this std (open_clip's "
        "is 1/sqrt(width), which trained features soon drown, leaving the pool blind to where things are)", above=0)
    mask_same_captions: bool = option(
        False, help="identical captions in a batch are not each other's negatives (always so with mirror, whose "
        "twins can read the same); off keeps CLIP's plain in-batch loss")
    epochs: int = option(10, help="contrastive epochs (0: none, for a text stage alone on `init`'s weights)",
                         at_least=0)
    world: WorldSupervision = option(
        factory=WorldSupervision, flatten=True,
        help="the offline world's own supervision, read from its scene graphs (`scenes`); its options nest under "
        "`world:` in a config file and keep their bare flags (rewards/recipes/clip_world.py, docs/offline_world.md)")


def train_clip(cfg: TrainClipConfig, progress: bool = True) -> dict:
    _validate(cfg)
    if (done := finished_summary(cfg, cfg.out, progress)) is not None:
        return done
    summary_path = Path(cfg.out).with_suffix(".json")
    run = RecipeRun(cfg, cfg.out, Path(cfg.out).with_suffix(".metrics.jsonl"), progress)
    world = cfg.world
    loaded = load_open_clip(cfg.arch, cfg.init)
    model = loaded.model
    if cfg.pool_position_std is not None:
        widen_pool_positions(model, cfg.pool_position_std, cfg.seed)
    tokenizer = ClipTokenizer(int(model.context_length))
    train = load_split(cfg.dataset, cfg.images_root, "train", cfg.max_train_images,
                       need_long=cfg.captions == "long" or bool(world.text_long_captions and world.text_negclip_epochs),
                       allow_outside_root=cfg.allow_outside_root)
    val = load_split(cfg.dataset, cfg.images_root, "val", cfg.max_val_images,
                     allow_outside_root=cfg.allow_outside_root)
    for split in (train, val):
        cache_pixels(split, loaded.preprocess, cfg.image_cache_mb, cfg.workers)
    scenes, world_seed = load_world_scenes(cfg.scenes) if cfg.scenes else ({}, None)
    editor = text_editor(train, cfg) if cfg.negatives == "text" else None
    texts = caption_texts(train, cfg.captions, negatives_of(cfg, train, scenes, editor))
    image_negative = counterfactual_images(train, scenes, world_seed) if world.image_negatives == "world" else None
    dataset = TextsDataset(train, loaded.preprocess, texts, cfg.seed, world.mirror, tuple(world.mirror_axes),
                           image_negative)
    head = (pretrain_vision(run, model, train, loaded.preprocess, scenes, world, cfg.arch)
            if world.vision_pretrain_epochs else None)
    if cfg.lock_image_tower:
        lock(model.visual)
    kept = kept_scene_labels(train, scenes, world)
    pair = PairEncoder.of_clip(model, head if kept else None)

    def evaluate(epoch: int) -> dict:
        return evaluate_retrieval(model, tokenizer, val, loaded.preprocess, run.device, cfg.workers)

    step = partial(contrastive_step, mask_same_captions=cfg.mask_same_captions or world.mirror != "none",
                   groundings=groundings(train, scenes, tokenizer, world), scene_labels=kept)
    record: dict = {}
    for stage, locked in contrastive_stages(cfg):
        if not stage.epochs:
            continue
        if locked:
            lock(model.visual)
        record = run.fit(pair, dataset, TextBatcher(tokenizer), step, stage, clamp_logit_scale,
                         None if locked else evaluate)["record"]
        if locked:
            unlock(model.visual)
    hard = cfg.hard_negatives if cfg.negatives == "world" else 0
    if (plan := text_stage_plan(world, train, cfg.captions, hard)).epochs:
        record = {**record, **read_relations(run, model, train, loaded.preprocess, scenes, tokenizer, plan, cfg.seed)}
        if run.is_main:
            record.update(evaluate(0))
    summary = {"out": cfg.out, "arch": cfg.arch, "val": record, "truncated_captions": tokenizer.truncated}
    if editor is not None:
        summary["text_negatives"] = edit_summary(editor, cfg.out, run.is_main)
    if run.is_main:
        save_weights(model, cfg.out)
        if cfg.scenes:
            report = foil_accuracy(model.encode_image, clip_text_forward(model), tokenizer, val, loaded.preprocess,
                                   cfg.scenes, "clip_s", run.device, cfg.workers)
            summary.update(announce(f"{cfg.out} (clip_s)", report))
        write_json(summary_path, summary_record(cfg, summary), indent=2)
    run.finish()
    return summary


def contrastive_stages(cfg: TrainClipConfig) -> list[tuple[Stage, bool]]:
    """The contrastive epochs as (stage, image tower locked): `locked_image_epochs` of them against the
    image tower as it starts, then the rest with both towers, drawing the data's next epochs."""
    locked = cfg.locked_image_epochs
    return [(Stage("clip_locked", locked, cfg.lr, cfg.warmup_steps, "constant"), True),
            (Stage("clip", cfg.epochs - locked, cfg.lr, cfg.warmup_steps, first_epoch=locked), False)]


def widen_pool_positions(model: torch.nn.Module, std: float, seed: int) -> None:
    """Redraw the attention pool's position embedding with a std that rivals the pooled features
    (norm ~20 after training here, against ~1 for open_clip's init): the pool's heads can then attend
    by place, and the image embedding carries where each thing is (docs/lab_book.md)."""
    pool = getattr(getattr(model, "visual", None), "attnpool", None)
    if pool is None:
        raise ConfigError("pool_position_std needs a ResNet vision tower with an attention pool "
                          "(e.g. world-clip-rn); this architecture has none")
    with torch.no_grad():
        pool.positional_embedding.normal_(0.0, std, generator=torch.Generator().manual_seed(seed))


def text_editor(split: Split, cfg: TrainClipConfig) -> TextEditor:
    """The text edits' editor over the captions the run draws from (rewards/recipes/text_negatives.py)."""
    captions = [c for pool in split.pool(cfg.captions) for c in pool]
    return checked_text_editor(captions, cfg.text_edits, cfg.seed, cfg.dataset)


NegativesOf = Callable[[str, int, random.Random], list[str]]


def negatives_of(cfg: TrainClipConfig, split: Split, scenes: dict[int, Scene],
                 editor: TextEditor | None) -> NegativesOf | None:
    """negatives(caption, row, rng): a caption's hard text negatives, by text edits or checked against the
    world's scenes; None when the run has none."""
    if not cfg.hard_negatives or cfg.negatives == "none":
        return None
    if editor is not None:
        return lambda caption, row, rng: [e.text for e in editor.edits(caption, rng, cfg.hard_negatives)]
    return checked_negatives(split, scenes, cfg.hard_negatives, tuple(cfg.world.negative_kinds))


def caption_texts(split: Split, kind: CaptionKind, negatives: NegativesOf | None = None):
    """texts(row, rng): one caption from the image's pool, then its hard negatives."""
    pools = split.pool(kind)

    def texts(row: int, rng: random.Random) -> list[str]:
        caption = pick(pools[row], rng)
        return [caption] if negatives is None else [caption, *negatives(caption, row, rng)]

    return texts


@dataclass
class EncodedBatch:
    image: torch.Tensor                   # [B, d] the global batch's images, normalised
    text: torch.Tensor                    # [B, T, d] each image's caption, then its hard negatives
    mask: torch.Tensor                    # [B, T] which texts are real
    logit_scale: torch.Tensor
    image_negatives: torch.Tensor | None  # [N, d] hard image negatives of the global batch
    local_image: torch.Tensor             # [b, d] this process's images
    extra_texts: tuple[torch.Tensor, ...]  # [V_i, d] per list of extra texts (the same on every process)
    image_labels: torch.Tensor | None = None  # [b, labels] the scene-label head's logits of this process's images


def encode_pairs(model: torch.nn.Module, batch: dict, extra_tokens: Sequence[torch.Tensor] = ()) -> EncodedBatch:
    """Normalised embeddings in one forward (DDP sees one call): the batch's images and texts, and
    each [V_i, L_i] list of `extra_tokens`, texts shared by every image (the groundings' nouns and phrases)."""
    tokens, mask = batch["tokens"], batch["mask"]
    b, t, length = tokens.shape
    flat = tokens.view(b * t, length)
    tree = prefix_tree(flat, t)  # the hard negatives repeat their caption's prefix: run it once
    extra_counts = [len(extra) for extra in extra_tokens]
    if extra_tokens:
        tree = tree.cat(PrefixTree.roots(sum(extra_counts), flat.device))
        flat = _cat_padded([flat, *(extra.to(flat.device) for extra in extra_tokens)])
    images = batch["images"]
    negatives = batch.get("negative_images")
    if negatives is not None:
        images = torch.cat([images, negatives])
    image, text, scale, labels = model(images, flat, tree)
    image = F.normalize(image.float(), dim=-1)
    text = F.normalize(text.float(), dim=-1)
    text, extra = text[: b * t], tuple(text[b * t:].split(extra_counts))
    image_negatives = None
    if negatives is not None:
        image, image_negatives = image[:b], image[b:]
        image_negatives = gather_with_grad(image_negatives)[gather_with_grad(batch["negative_mask"])]
    return EncodedBatch(gather_with_grad(image), gather_with_grad(text.view(b, t, -1)), gather_with_grad(mask),
                        scale, image_negatives, image, extra, None if labels is None else labels[:b])


def contrastive_step(model: torch.nn.Module, batch: dict, mask_same_captions: bool = False,
                     groundings: Sequence[tuple[Grounding, float]] = (),
                     scene_labels: tuple[torch.Tensor, torch.Tensor, float] | None = None
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """NegCLIP's loss, plus each grounding's and, with `scene_labels` ([train rows, kept labels], the kept
    columns of the head's output, weight), the scene-label loss of the pair's image head on those labels."""
    encoded = encode_pairs(model, batch, [grounding.tokens for grounding, _ in groundings])
    caption_ids = gather_with_grad(batch["caption_ids"]) if mask_same_captions else None
    parts = {"negatives": float(encoded.mask[:, 1:].sum()) / len(encoded.mask)}
    if encoded.image_negatives is not None:
        parts["image_negatives"] = len(encoded.image_negatives) / len(encoded.mask)
    loss = negclip_loss(encoded.image, encoded.text, encoded.mask, encoded.logit_scale, caption_ids,
                        encoded.image_negatives)
    for (grounding, weight), grounded in zip(groundings, encoded.extra_texts, strict=True):
        term = grounding.loss(encoded.local_image, grounded, encoded.logit_scale, batch["rows"])
        parts[grounding.name] = term.item()
        loss = loss + weight * term
    if scene_labels is not None:
        labels, columns, weight = scene_labels
        logits = encoded.image_labels[:, columns.to(encoded.image_labels.device)]
        term = scene_label_loss(logits, labels[batch["rows"].cpu()].to(logits.device))
        parts["scene_labels"] = term.item()
        loss = loss + weight * term
    return loss, parts


def _cat_padded(tokens: list[torch.Tensor]) -> torch.Tensor:
    """Token rows of several widths as one [N, widest] tensor, padded with 0 (after EOT, which the
    causal text tower never reads)."""
    width = max(t.shape[1] for t in tokens)
    return torch.cat([F.pad(t, (0, width - t.shape[1])) for t in tokens])


def clamp_logit_scale(pair: PairEncoder) -> None:
    with torch.no_grad():
        pair.module.logit_scale.clamp_(0, MAX_LOGIT_SCALE)


@torch.no_grad()
def evaluate_retrieval(model, tokenizer: ClipTokenizer, val: Split, transform, device: torch.device,
                       workers: int = 0) -> dict:
    """R@1 both ways on val with each image's first short caption and, where present, first long one;
    the model comes back in the mode it came in."""
    training = model.training
    model.eval()
    text_forward = clip_text_forward(model)
    image = embed_split_images(model.encode_image, val, transform, device, workers)
    out = {}
    for kind, pools in (("short", val.short), ("long", val.long)):
        if not all(pools):
            continue
        text = embed_texts(text_forward, tokenizer, [p[0] for p in pools], device)
        out.update({f"val_{kind}_{k}": v for k, v in recall_at_1(image, text).items()})
    model.train(training)
    return out


def _validate(cfg: TrainClipConfig) -> None:
    require_keys(cfg, ("dataset", "images_root", "out"), "train_clip")
    if not cfg.out.endswith(".safetensors"):
        raise ConfigError(f"train_clip 'out' must end in .safetensors, got {cfg.out!r}")
    if cfg.negatives == "world" and not cfg.scenes:
        raise ConfigError("negatives: world needs 'scenes' (the world's scenes.json)")
    validate_world(cfg.world, cfg.scenes, cfg.lock_image_tower)
    if not cfg.epochs and not (text_epochs(cfg.world) and cfg.init):
        raise ConfigError("epochs: 0 trains no contrastive stage; it is for a text stage (world.text_*_epochs) on "
                          "the weights of 'init'")
    if cfg.locked_image_epochs > cfg.epochs:
        raise ConfigError(f"locked_image_epochs ({cfg.locked_image_epochs}) counts among the contrastive epochs: at "
                          f"most epochs ({cfg.epochs})")
    if cfg.locked_image_epochs and cfg.lock_image_tower:
        raise ConfigError("locked_image_epochs locks the image tower for the first epochs only; lock_image_tower "
                          "already locks it for all of them: set one")
    if (cfg.lock_image_tower or cfg.locked_image_epochs) and not (cfg.init or cfg.world.vision_pretrain_epochs):
        key = "lock_image_tower" if cfg.lock_image_tower else "locked_image_epochs"
        raise ConfigError(f"{key} keeps the image tower as it starts; a random one sees nothing: give "
                          "'init' (trained weights) or world.vision_pretrain_epochs")
    if cfg.pool_position_std is not None and cfg.init:
        raise ConfigError("pool_position_std redraws weights a pretrained model has learned; use it without 'init'")
    check_text_edits(cfg.text_edits)
