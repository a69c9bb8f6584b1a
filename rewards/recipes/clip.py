"""Contrastive training of an open_clip architecture (by default `world-clip-tiny`, registered from
features/clip_models/model_configs) on a Karpathy-format dataset's images with their short and
long captions, optionally with hard text negatives (NegCLIP): each image's caption with one fact
changed, checked false against the world's scene graphs (`negatives: world`).

It writes an open_clip state dict (safetensors) that loads through the same path as any user
checkpoint (`load_open_clip(arch, path)`), reports image->text / text->image R@1 on val each epoch
and, on the offline world, ends with its world-foil accuracy per kind. Data streams from the image
files (`accelerate launch -m rewards.train_clip` for several processes); an interrupted run
resumes from its last finished epoch.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Sequence
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
from features.world.counterfactual import counterfactual, rerender
from features.world.negatives import KINDS, hard_negatives
from features.world.parse import parse_caption
from features.world.scene import Scene, load_world_scenes
from plumbing.atomic import write_json
from plumbing.config import option, require_keys
from plumbing.errors import ConfigError, DataError
from rewards.recipes.attribute_facts import ATTRIBUTES
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
from rewards.recipes.grounding import PHRASE_ATTRIBUTES, Grounding, NounTargets
from rewards.recipes.loop import PairEncoder, RecipeConfig, RecipeRun, Stage
from rewards.recipes.mirror import AXES, MirrorMode
from rewards.recipes.scene_labels import (
    BLOCKS,
    LABEL_GROUPS,
    label_columns,
    pretrain_on_scene_labels,
    scene_label_loss,
    scene_labels,
)
from rewards.recipes.text_stage import TextStagePlan, read_relations
from rewards.recipes.training import finished_summary, lock, save_weights, summary_record, unlock
from rewards.text.edits import KINDS as TEXT_EDITS
from rewards.text.edits import EditStats, TextEditor

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
    image_negatives: Literal["none", "world"] = option(
        "none", help="hard image negatives: none, or world (each image's scene with one fact that its caption "
        "states changed, rendered and checked false of the caption by the world parser; needs `scenes`)")
    hard_negatives: int = option(3, help="hard negatives per image and step (with negatives: world)", at_least=0)
    negative_kinds: list[str] = option(factory=lambda: list(KINDS), help="the kinds of fact a negative may change")
    text_edits: list[str] = option(factory=lambda: list(TEXT_EDITS), help="negatives: text, the edits a negative may "
                                   "come from")
    vision_pretrain_epochs: int = option(
        0, help="epochs of supervised pretraining of the image tower on the world's scene graphs (`scenes`, train "
        "split) before the contrastive stage: a linear head predicts which objects (shape, colour) the image "
        "holds with each one's size, texture and place, the background and the count (LiT-style)", at_least=0)
    lock_image_tower: bool = option(
        False, help="LiT: the contrastive stage trains the text tower and the temperature only, against an "
        "image tower kept as it starts (from `init` or vision_pretrain_epochs)")
    locked_image_epochs: int = option(
        0, help="the first of the contrastive `epochs` train the text tower and the temperature against the image "
        "tower as it starts (LiT, at a constant rate), then both towers train, so the text tower learns to read what "
        "the pretrained tower sees before the joint epochs move it (0: both towers from the start; on the world, "
        "three seeds of 1 disagreed: docs/lab_book.md)", at_least=0)
    vision_map_labels: float = option(
        0.0, help="with vision_pretrain_epochs: weight of labels read off each place of the image tower's last "
        "feature map (the shape, colour, size and texture of what is centred there), besides the scene labels "
        "read off the embedding (0: off)", at_least=0)
    pool_position_std: float | None = option(
        None, help="from scratch only: draw the ResNet attention pool's position embedding with this std (open_clip's "
        "is 1/sqrt(width), which trained features soon drown, leaving the pool blind to where things are)", above=0)
    mask_same_captions: bool = option(
        False, help="identical captions in a batch are not each other's negatives (always so with mirror, whose "
        "twins can read the same); off keeps CLIP's plain in-batch loss")
    mirror: MirrorMode = option(
        "none", help="flipped views with their texts rewritten (left<->right, above<->below): none, random (each "
        "image flipped at random), or pairs (each image with its mirrored twin in the same batch, so places and "
        "relations are what tells them apart)")
    mirror_axes: list[str] = option(factory=lambda: ["horizontal"], help="axes a view may flip: horizontal, "
                                    "vertical (for worlds where up and down are arbitrary; not for photos)")
    noun_loss: float = option(
        0.0, help="weight of a loss that grounds the bare shape nouns (\"star\", \"stars\"; every shape word of the "
        "world) in the images that hold them, as F-CLIPScore reads them; needs `scenes` (0: off)", at_least=0)
    noun_targets: NounTargets = option(
        "spread", help="with noun_loss: spread (one softmax over every noun, the target spread evenly over the nouns "
        "of the shapes the image holds) or presence (each of those nouns in its own softmax against the nouns of "
        "the shapes it lacks, so every object of a crowded scene counts in full) or presence_floor (that, with "
        "cosine 0 also a rival: F-CLIPScore counts a noun under 0 as nothing)")
    phrase_loss: float = option(
        0.0, help="weight of a loss that grounds object phrases (\"a small red striped circle\", every combination "
        "of size, colour, texture and shape) in the images that hold such an object, against the phrases that "
        "differ from it; needs `scenes` (0: off)", at_least=0)
    phrase_attributes: list[str] = option(
        factory=lambda: list(PHRASE_ATTRIBUTES), help="with phrase_loss: the attributes its phrases name, of "
        "size, color, texture and shape (always); fewer attributes, fewer phrases each step (all four: 336)")
    scene_label_loss: float = option(
        0.0, help="with vision_pretrain_epochs: weight of the scene labels kept through the contrastive stage (the "
        "pretraining head goes on reading the image embedding), so the image tower does not trade what in-batch "
        "captions rarely tell apart (the background, textures, sizes) for what they do (0: off)", at_least=0)
    scene_label_groups: list[str] = option(
        factory=lambda: list(BLOCKS), help="with scene_label_loss: the scene labels it keeps: objects (each "
        "(shape, colour) held, with its size, texture and place), background, count, cells (each grid cell's "
        "occupancy, shapes and colours), texture or size (each (shape, colour)'s texture or size bits alone, "
        "parts of objects)")
    epochs: int = option(10, help="contrastive epochs (0: none, for a text stage alone on `init`'s weights)",
                         at_least=0)
    text_roles_epochs: int = option(
        0, help="text stage, after the contrastive stage, image tower and temperature frozen (rewards/recipes/"
        "text_stage.py): epochs over the train scenes' relation facts in which a head on the text embedding "
        "reads which relation each named colour and shape stands in; needs `scenes` (0: off)", at_least=0)
    text_pairs_epochs: int = option(
        0, help="text stage: epochs over the relation facts on `text_pairs_axes` in which each fact's statement "
        "must beat the same words with the inverse relation against the image (roles kept on; 0: off)", at_least=0)
    text_negclip_epochs: int = option(
        0, help="text stage: epochs of NegCLIP on the captions and their hard negatives against the frozen image "
        "embeddings, two of each image's relation pairs and their roles kept on (0: off)", at_least=0)
    text_pairs_axes: list[str] = option(factory=lambda: ["horizontal", "vertical"], help="text stage: the axes "
                                        "whose relations the pairs phase states (the roles and negclip phases: all)")
    text_batch_size: int = option(256, help="text stage: statements per step of the pairs phase (the negclip phase "
                                  "takes `text_negclip_batch_size` images)", at_least=2)
    text_negclip_batch_size: int | None = option(
        None, help="text stage: images per step of the negclip phase (each with its caption and hard negatives; "
        "null: `batch_size`). With `text_negclip_epochs` raised in step, the phase keeps its number of steps and "
        "each step averages more captions (docs/lab_book.md, \"The NegCLIP phase at twice the batch and twice "
        "the epochs\")", at_least=2)
    text_roles_batch_size: int = option(
        128, help="text stage: statements per step of the roles phase, which runs at a constant `text_lr`: the roles "
        "leave their plateau after a number of steps, not of statements", at_least=2)
    text_lr: float = option(5e-4, help="text stage: peak learning rate of each phase (cosine to 0, no warmup; the "
                            "roles phase holds it)", above=0)
    text_attributes: list[str] = option(
        factory=list, help="text stage: attributes (size, color, place, texture, background, count) whose pairs "
        "join the pairs and negclip phases: one object's attribute, or the scene's background or count, stated "
        "against the same words with it changed (\"a small red disc\" / \"a large red disc\", \"three shapes\" / "
        "\"two shapes\"), the true one to beat the other against the image (rewards/recipes/attribute_facts.py)")
    text_long_statements: float = option(
        0.0, help="text stage: the share of relation statements worded as the long captions word them (\"A big red "
        "disc with a striped pattern. It is above the small blue star.\"); the rest as short captions", at_least=0,
        at_most=1)
    text_other_frames: float = option(
        0.0, help="text stage: the share of relation statements said in another frame, the subject not simply "
        "named first (\"above a blue star is a red circle\", \"a blue star with a red circle above it\"): the "
        "tower learns the subject from the syntax, not the word order (0.25 over three val seeds: reworded "
        "foils +0.044, long relations 0.936 -> 0.953; docs/lab_book.md, \"Relations in other frames\")",
        at_least=0, at_most=1)
    text_long_captions: float = option(
        0.0, help="text stage: the share of the negclip phase's images whose caption (with its hard negatives) is "
        "one of their long captions; the rest draw from the `captions` pool, as the contrastive stage does. A long "
        "caption's relation sits among sixty tokens of other facts, and the pairs phase's short statements do not "
        "teach the tower to find it there (0: the pool only)", at_least=0, at_most=1)
    relation_loss: float = option(
        0.0, help="weight of a loss that grounds relation phrases (\"a circle to the left of a star\", \"a red shape "
        "above a blue shape\") in the images where they hold, against the other relations of the image's own "
        "objects; needs `scenes`, not with `mirror` (0: off)",
        at_least=0)


def train_clip(cfg: TrainClipConfig, progress: bool = True) -> dict:
    _validate(cfg)
    if (done := finished_summary(cfg, cfg.out, progress)) is not None:
        return done
    summary_path = Path(cfg.out).with_suffix(".json")
    run = RecipeRun(cfg, cfg.out, Path(cfg.out).with_suffix(".metrics.jsonl"), progress)
    loaded = load_open_clip(cfg.arch, cfg.init)
    model = loaded.model
    if cfg.pool_position_std is not None:
        widen_pool_positions(model, cfg.pool_position_std, cfg.seed)
    tokenizer = ClipTokenizer(int(model.context_length))
    train = load_split(cfg.dataset, cfg.images_root, "train", cfg.max_train_images,
                       need_long=cfg.captions == "long" or bool(cfg.text_long_captions and cfg.text_negclip_epochs),
                       allow_outside_root=cfg.allow_outside_root)
    val = load_split(cfg.dataset, cfg.images_root, "val", cfg.max_val_images,
                     allow_outside_root=cfg.allow_outside_root)
    for split in (train, val):
        cache_pixels(split, loaded.preprocess, cfg.image_cache_mb, cfg.workers)
    scenes, world_seed = load_world_scenes(cfg.scenes) if cfg.scenes else ({}, None)
    editor = text_editor(train, cfg) if cfg.negatives == "text" else None
    texts = caption_texts(train, cfg.captions, cfg, scenes, editor)
    image_negative = counterfactual_images(train, scenes, world_seed) if cfg.image_negatives == "world" else None
    dataset = TextsDataset(train, loaded.preprocess, texts, cfg.seed, cfg.mirror, tuple(cfg.mirror_axes),
                           image_negative)
    head = pretrain_vision(run, model, train, loaded.preprocess, scenes, cfg) if cfg.vision_pretrain_epochs else None
    if cfg.lock_image_tower:
        lock(model.visual)
    columns = label_columns(cfg.scene_label_groups)
    kept = (scene_labels(train, scenes)[:, columns], columns, cfg.scene_label_loss) if cfg.scene_label_loss else None
    pair = PairEncoder.of_clip(model, head if cfg.scene_label_loss else None)

    def evaluate(epoch: int) -> dict:
        return evaluate_retrieval(model, tokenizer, val, loaded.preprocess, run.device, cfg.workers)

    nouns = partial(Grounding.shape_nouns, targets=cfg.noun_targets)
    phrases = partial(Grounding.object_phrases, attributes=cfg.phrase_attributes)
    groundings = [(build(train, scenes, tokenizer), weight) for build, weight in
                  ((nouns, cfg.noun_loss), (phrases, cfg.phrase_loss),
                   (Grounding.relation_phrases, cfg.relation_loss)) if weight]
    step = partial(contrastive_step, mask_same_captions=cfg.mask_same_captions or cfg.mirror != "none",
                   groundings=groundings, scene_labels=kept)
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
    if (plan := text_stage_plan(cfg, train)).epochs:
        record = {**record, **read_relations(run, model, train, loaded.preprocess, scenes, tokenizer, plan, cfg.seed)}
        if run.is_main:
            record.update(evaluate(0))
    summary = {"out": cfg.out, "arch": cfg.arch, "val": record, "truncated_captions": tokenizer.truncated}
    if editor is not None:
        summary["text_negatives"] = {"tried": dict(editor.stats.tried), "impossible": dict(editor.stats.impossible),
                                     "captions_without_edit": len(editor.stats.no_edit)}
        if run.is_main:
            print(f"{cfg.out}: text negatives: {editor.stats.summary()}", flush=True)
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


def text_stage_plan(cfg: TrainClipConfig, train: Split) -> TextStagePlan:
    hard = cfg.hard_negatives if cfg.negatives == "world" else 0
    return TextStagePlan(
        roles_epochs=cfg.text_roles_epochs, pairs_epochs=cfg.text_pairs_epochs,
        negclip_epochs=cfg.text_negclip_epochs, batch_size=cfg.text_batch_size,
        roles_batch_size=cfg.text_roles_batch_size, negclip_batch_size=cfg.text_negclip_batch_size,
        lr=cfg.text_lr, pair_axes=tuple(cfg.text_pairs_axes), attributes=tuple(cfg.text_attributes),
        long_rate=cfg.text_long_statements, long_share=cfg.text_long_captions, other_frames=cfg.text_other_frames,
        caption_pool=train.pool(cfg.captions), hard_negatives=hard, negative_kinds=tuple(cfg.negative_kinds))


def pretrain_vision(run: RecipeRun, model: torch.nn.Module, train: Split, transform, scenes: dict[int, Scene],
                    cfg: TrainClipConfig) -> torch.nn.Linear:
    """The image tower trained to predict the scene labels (rewards.recipes.scene_labels) before
    the contrastive stage; returns the labels' head."""
    width = getattr(model.visual, "output_dim", None)
    if not isinstance(width, int):
        raise ConfigError(f"vision_pretrain_epochs: cannot tell the output width of {cfg.arch}'s image tower "
                          "(open_clip's ResNet and ViT towers have one)")
    return pretrain_on_scene_labels(run, model.visual, width, train, transform, scenes, cfg.vision_pretrain_epochs,
                                    cfg.vision_map_labels)


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
    """The text edits' editor over the captions the run draws from (parsed once). Captions no edit applies
    to are counted and named; when none of them admits one, the option would train nothing: an error."""
    captions = [c for pool in split.pool(cfg.captions) for c in pool]
    editor = TextEditor(captions, cfg.text_edits)
    probe = random.Random(cfg.seed)
    bare = [c for c in dict.fromkeys(captions) if not editor.edits(c, probe, 1)]
    if len(bare) == len(set(captions)):
        raise DataError(f"{cfg.dataset}: negatives: text: no edit of {', '.join(cfg.text_edits)} applies to any "
                        f"train caption (e.g. {bare[0]!r}); allow more edits or use negatives: none")
    if bare:
        print(f"warning: negatives: text: {len(bare)} of {len(set(captions))} train captions admit no edit and "
              f"train without hard negatives, e.g. {bare[:3]}", file=sys.stderr)
    editor.stats = EditStats()  # the run's own counts, without the probe's
    return editor


def caption_texts(split: Split, kind: CaptionKind, cfg: TrainClipConfig, scenes: dict[int, Scene],
                  editor: TextEditor | None = None):
    """texts(row, rng): one caption from the image's pool, then its hard negatives."""
    pools = split.pool(kind)
    kinds = tuple(cfg.negative_kinds)

    def texts(row: int, rng: random.Random) -> list[str]:
        caption = pick(pools[row], rng)
        if editor is not None and cfg.hard_negatives:
            return [caption, *(e.text for e in editor.edits(caption, rng, cfg.hard_negatives))]
        if cfg.negatives != "world" or not cfg.hard_negatives:
            return [caption]
        scene = scenes[split.image_ids[row]]
        return [caption, *(n.text for n in hard_negatives(caption, scene, rng, cfg.hard_negatives, kinds))]

    return texts


def counterfactual_images(split: Split, scenes: dict[int, Scene], world_seed: int | None):
    """image_negative(row, rng, caption): the row's scene with one fact the caption states changed,
    drawn with the original's background and noise (None when no edit contradicts the caption)."""

    def image_negative(row: int, rng: random.Random, caption: str):
        image_id = split.image_ids[row]
        edited = counterfactual(scenes[image_id], parse_caption(caption), rng)
        return None if edited is None else rerender(scenes[image_id], edited, world_seed, image_id)

    return image_negative


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
    if cfg.vision_map_labels and not cfg.vision_pretrain_epochs:
        raise ConfigError("vision_map_labels is read during the scene-label stage: set vision_pretrain_epochs too")
    if cfg.vision_pretrain_epochs and not cfg.scenes:
        raise ConfigError("vision_pretrain_epochs needs 'scenes' (the world's scenes.json: the labels)")
    for key in ("noun_loss", "phrase_loss", "relation_loss"):
        if getattr(cfg, key) and not cfg.scenes:
            raise ConfigError(f"{key} needs 'scenes' (the world's scenes.json: which objects each image holds)")
    if cfg.scene_label_loss and not cfg.vision_pretrain_epochs:
        raise ConfigError("scene_label_loss keeps training the scene-label stage's head: set vision_pretrain_epochs")
    if cfg.scene_label_loss and cfg.lock_image_tower:
        raise ConfigError("scene_label_loss trains the image tower, which lock_image_tower keeps as it starts")
    unknown = sorted(set(cfg.scene_label_groups) - set(LABEL_GROUPS))
    if unknown or not cfg.scene_label_groups:
        problem = f"unknown group {unknown[0]!r}" if unknown else "no group named"
        raise ConfigError(f"scene_label_groups: {problem}; the groups are {', '.join(LABEL_GROUPS)}")
    if cfg.relation_loss and cfg.mirror != "none":
        raise ConfigError("relation_loss reads relations off the unflipped scenes; it cannot be used with mirror")
    if cfg.scene_label_loss and cfg.mirror != "none":
        raise ConfigError("scene_label_loss reads places off the unflipped scenes; it cannot be used with mirror")
    text_stage = cfg.text_roles_epochs + cfg.text_pairs_epochs + cfg.text_negclip_epochs
    if text_stage and not cfg.scenes:
        raise ConfigError("the text stage (text_*_epochs) states the scenes' relations: it needs 'scenes'")
    if not cfg.epochs and not (text_stage and cfg.init):
        raise ConfigError("epochs: 0 trains no contrastive stage; it is for a text stage (text_*_epochs) on the "
                          "weights of 'init'")
    if cfg.image_negatives == "world" and not cfg.scenes:
        raise ConfigError("image_negatives: world needs 'scenes' (the world's scenes.json)")
    if cfg.locked_image_epochs > cfg.epochs:
        raise ConfigError(f"locked_image_epochs ({cfg.locked_image_epochs}) counts among the contrastive epochs: at "
                          f"most epochs ({cfg.epochs})")
    if cfg.locked_image_epochs and cfg.lock_image_tower:
        raise ConfigError("locked_image_epochs locks the image tower for the first epochs only; lock_image_tower "
                          "already locks it for all of them: set one")
    if (cfg.lock_image_tower or cfg.locked_image_epochs) and not (cfg.init or cfg.vision_pretrain_epochs):
        key = "lock_image_tower" if cfg.lock_image_tower else "locked_image_epochs"
        raise ConfigError(f"{key} keeps the image tower as it starts; a random one sees nothing: give "
                          "'init' (trained weights) or vision_pretrain_epochs")
    if cfg.pool_position_std is not None and cfg.init:
        raise ConfigError("pool_position_std redraws weights a pretrained model has learned; use it without 'init'")
    for key, known in (("mirror_axes", AXES), ("negative_kinds", KINDS), ("phrase_attributes", PHRASE_ATTRIBUTES),
                       ("text_edits", TEXT_EDITS),
                       ("text_pairs_axes", AXES), ("text_attributes", ATTRIBUTES)):
        if unknown := sorted(set(getattr(cfg, key)) - set(known)):
            raise ConfigError(f"{key}: unknown {unknown}; known: {', '.join(known)}")
    if cfg.mirror != "none" and not cfg.mirror_axes:
        raise ConfigError(f"mirror: {cfg.mirror} needs at least one of mirror_axes ({', '.join(AXES)})")
    if "shape" not in cfg.phrase_attributes:
        raise ConfigError("phrase_attributes: shape is missing; an object phrase names its shape")
