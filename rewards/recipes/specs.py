"""SPECS's specificity fine-tuning (papers/specs_paper.txt §3.3): a CLIP stretched to 248 text
positions by the LongCLIP rule is trained with

    L = α·L_contrastive + β·L_pos + γ·L_neg                                          (Eq. 4)
    L_pos = mean max(0, θ(i, c_j) − θ(i, c_j + d₊) + ε₊)                              (Eq. 3)
    L_neg = mean max(0, θ(i, c_j + d₋) − θ(i, c_j) + ε₋)

with ε the detached batch mean of the wanted gap, clamped to [0, max_margin], and θ the
logit-scaled cosine (as the released code). Triplets come from detail units (the world records
them; `rewards.detail_units` segments any caption). The result is written in the SPECS layout
(`spec.pt`: OpenAI-CLIP keys + positional_embedding_res) and loads with kind `longclip`; the
starting model can be written too, so `rewards.specificity` can compare the two. With
`negatives: world` or `text` the contrastive term also ranks hard text negatives (as train_clip does), so
the fine-tuning keeps what the starting CLIP sees; with `edited_negatives` a negative triplet's d- may
be the true next unit with one fact changed, so a detail raises the score for what it says, not for being
one more. The change is checked false of the scene by the world parser (`negatives: world` or none), or made
by a text edit of the unit alone (`negatives: text`: any captions, no scenes; rewards/text/edits.py). It
ends with its world-foil accuracy (specs).
"""


from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from open_clip.transform import image_transform

from features.clip_models.factory import clip_text_forward
from features.clip_models.longclip import (
    LONG_CONTEXT,
    heads_entry,
    load_longclip,
    longclip_from_state,
    longclip_state,
    stretch_state_dict,
)
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.text_batches import prefix_tree
from features.clip_models.tokens import ClipTokenizer
from features.world.negatives import KINDS, hard_negatives
from features.world.scene import Scene, load_scenes
from plumbing.atomic import write_json
from plumbing.config import option, require_keys
from plumbing.errors import ConfigError, DataError
from rewards.recipes.contrastive import gather_with_grad, info_nce, negclip_loss
from rewards.recipes.data import Split, TextBatcher, TextsDataset, cache_pixels, load_split
from rewards.recipes.foil_report import announce, foil_accuracy
from rewards.recipes.loop import PairEncoder, RecipeConfig, RecipeRun, Stage
from rewards.recipes.specificity import detail_units_of, join_units, negative_unit, scene_negative_filter
from rewards.recipes.text_negatives import check_text_edits, checked_text_editor, edit_summary
from rewards.recipes.training import finished_summary, lock, save_pt, summary_record
from rewards.text.edits import KINDS as TEXT_EDITS
from rewards.text.edits import TextEditor

TRIPLET = 4  # texts 0-3 of an image: caption, c_j, c_j + d+, c_j + d-; hard negatives follow


@dataclass
class TrainSpecsConfig(RecipeConfig):
    init: str = option("", help="starting weights: an open_clip file (stretched here) or a LongCLIP/SPECS .pt")
    init_kind: Literal["open_clip", "longclip"] = option("open_clip", help="what `init` holds")
    arch: str = option("world-clip-tiny", help="open_clip architecture of `init` (init_kind open_clip)")
    out: str = option("", help="output SPECS checkpoint (.pt, the released spec.pt layout)")
    epochs: int = option(3, help="training epochs", at_least=1)
    batch_size: int = option(64, help="images per optimizer step over all processes", at_least=2)
    lr: float = option(1e-4, help="peak learning rate (warmup, then cosine to 0)", above=0)
    weight_decay: float = option(0.01, help="AdamW weight decay (not on gains, biases, embeddings)", at_least=0)
    warmup_steps: int = option(20, help="linear warmup steps", at_least=0)
    start_out: str | None = option(None, help="also write the starting (stretched) model here, same layout")
    alpha: float = option(1.0, help="weight of the contrastive loss (Eq. 4)", at_least=0)
    beta: float = option(8.0, help="weight of the positive detail hinge L_pos", at_least=0)
    gamma: float = option(0.8, help="weight of the negative detail hinge L_neg", at_least=0)
    max_margin: float = option(1.5, help="clamp of the dynamic margin (logit units)", at_least=0)
    shuffle_ratio: float = option(0.9, help="share of negative units whose words are shuffled", at_least=0, at_most=1)
    negatives: Literal["none", "world", "text"] = option(
        "none", help="hard text negatives in the contrastive term, as train_clip: none; world (checked false "
        "against `scenes`); or text (the long caption edited with no scene, any captions)")
    hard_negatives: int = option(2, help="hard negatives per image and step (with negatives: world or text)",
                                 at_least=0)
    text_edits: list[str] = option(factory=lambda: list(TEXT_EDITS), help="negatives: text, the edits a negative "
                                   "may come from")
    edited_negatives: float = option(0.0, help="share of negative triplets whose d- is the true next unit with one "
                                     "fact changed instead of another image's unit (0: the paper's): by a text edit "
                                     "of the unit with negatives: text, else checked false of the scene by the world "
                                     "parser (needs scenes)", at_least=0, at_most=1)
    lock_image_tower: bool = option(False, help="train the text tower and the temperature only, against the starting "
                                    "model's image tower kept as it is and run as scoring runs it (eval mode: its "
                                    "batch norms on their running statistics, which stay)")


def dynamic_margin_hinge(bigger: torch.Tensor, smaller: torch.Tensor, max_margin: float) -> tuple[torch.Tensor, float]:
    """mean max(0, smaller − bigger + ε), ε = clamp(detach(mean(bigger − smaller)), 0, max_margin)."""
    margin = (bigger - smaller).mean().detach().clamp(0.0, max_margin)
    return F.relu(smaller - bigger + margin).mean(), float(margin)


def specs_loss(logit_scale: torch.Tensor, image: torch.Tensor, caption: torch.Tensor, base: torch.Tensor,
               positive: torch.Tensor, negative: torch.Tensor, cfg: TrainSpecsConfig,
               contrastive: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """All embeddings normalised; row i of every text tensor belongs to image i. `contrastive`
    replaces the plain CLIP term (e.g. NegCLIP's, with hard negatives)."""
    scale = logit_scale.exp()

    def theta(text: torch.Tensor) -> torch.Tensor:
        return scale * (image * text).sum(-1)

    contrastive = info_nce(image, caption, logit_scale) if contrastive is None else contrastive
    base_sim = theta(base)
    pos, pos_margin = dynamic_margin_hinge(theta(positive), base_sim, cfg.max_margin)
    neg, neg_margin = dynamic_margin_hinge(base_sim, theta(negative), cfg.max_margin)
    loss = cfg.alpha * contrastive + cfg.beta * pos + cfg.gamma * neg
    return loss, {"contrastive": contrastive.item(), "pos": pos.item(), "neg": neg.item(),
                  "pos_margin": pos_margin, "neg_margin": neg_margin}


def starting_model(cfg: TrainSpecsConfig):
    if cfg.init_kind == "longclip":
        return load_longclip(cfg.init)
    loaded = load_open_clip(cfg.arch, cfg.init)
    stretched = stretch_state_dict(loaded.model.state_dict()) | heads_entry(loaded.model)
    return longclip_from_state(stretched, f"{cfg.init} (stretched)")


def train_specs(cfg: TrainSpecsConfig, progress: bool = True) -> dict:
    _validate(cfg)
    if (done := finished_summary(cfg, cfg.out, progress)) is not None:
        return done
    run = RecipeRun(cfg, cfg.out, Path(cfg.out).with_suffix(".log.jsonl"), progress)
    model = starting_model(cfg)
    if cfg.lock_image_tower:
        lock(model.visual)
    if cfg.start_out and run.is_main:
        save_pt(longclip_state(model), cfg.start_out)
    transform = image_transform(model.visual.image_size, is_train=False)
    split = load_split(cfg.dataset, cfg.images_root, "train", cfg.max_train_images, need_long=True,
                       allow_outside_root=cfg.allow_outside_root)
    train = with_units(cfg.dataset, split)
    editor = triplet_editor(train, cfg) if cfg.negatives == "text" else None
    if cfg.epochs > 1:  # one epoch reads each image once either way
        cache_pixels(train, transform, cfg.image_cache_mb, cfg.workers)
    tokenizer = ClipTokenizer(LONG_CONTEXT)
    dataset = TextsDataset(train, transform, triplet_texts(train, cfg, editor), cfg.seed)

    def step(pair: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        return specs_step(pair, batch, cfg)

    result = run.fit(PairEncoder.of_clip(model), dataset, TextBatcher(tokenizer), step,
                     Stage("specs", cfg.epochs, cfg.lr, cfg.warmup_steps))
    summary = {"out": cfg.out, "start_out": cfg.start_out, "last_epoch": result["record"],
               "truncated_captions": tokenizer.truncated}
    if editor is not None:
        summary["text_negatives"] = edit_summary(editor, cfg.out, run.is_main)
    if run.is_main:
        save_pt(longclip_state(model), cfg.out)
        if cfg.scenes:
            val = load_split(cfg.dataset, cfg.images_root, "val", cfg.max_val_images,
                             allow_outside_root=cfg.allow_outside_root)
            report = foil_accuracy(model.encode_image, clip_text_forward(model), tokenizer, val, transform,
                                   cfg.scenes, "specs", run.device, cfg.workers)
            summary.update(announce(f"{cfg.out} (specs)", report))
        write_json(Path(cfg.out).with_suffix(".json"), summary_record(cfg, summary), indent=2)
    run.finish()
    return summary


def triplet_editor(train: Split, cfg: TrainSpecsConfig) -> TextEditor:
    """negatives: text's editor, parsed once over the long captions and (for edited_negatives) their units."""
    units = [u for e in train.entries for u in detail_units_of(e)[0]] if cfg.edited_negatives else []
    captions = [join_units(detail_units_of(e)[0]) for e in train.entries]
    return checked_text_editor([*captions, *units], cfg.text_edits, cfg.seed, cfg.dataset)


def triplet_texts(train: Split, cfg: TrainSpecsConfig, editor: TextEditor | None = None):
    """texts(row, rng): the long caption, one specificity triplet at a random prefix, hard negatives."""
    units = [detail_units_of(e)[0] for e in train.entries]
    scenes = load_scenes(cfg.scenes) if cfg.scenes and editor is None else None
    allowed = scene_negative_filter(scenes, train.image_ids) if scenes is not None else None

    def texts(row: int, rng: random.Random) -> list[str]:
        own = units[row]
        scene = scenes[train.image_ids[row]] if scenes is not None else None
        j = rng.randrange(1, len(own))
        base, positive = join_units(own[:j]), join_units(own[: j + 1])
        negative = None
        if cfg.edited_negatives and rng.random() < cfg.edited_negatives:
            negative = (edited_unit(base, positive, scene, rng) if editor is None
                        else text_edited_unit(base, own[j], editor, rng))
        if negative is None:
            negative = f"{base} {negative_unit(units, row, rng, cfg.shuffle_ratio, allowed)}"
        out = [join_units(own), base, positive, negative]
        if cfg.negatives == "world" and cfg.hard_negatives:
            out += [n.text for n in hard_negatives(out[0], scene, rng, cfg.hard_negatives, KINDS)]
        elif editor is not None and cfg.hard_negatives:
            out += [e.text for e in editor.edits(out[0], rng, cfg.hard_negatives)]
        return out

    return texts


def edited_unit(base: str, positive: str, scene: Scene, rng: random.Random) -> str | None:
    """c_j + d+ with one fact of d+ changed, or None when no edit of the builder lands in d+: adding
    a detail raises the score for what it says, not for being one more detail."""
    edits = [n.text for n in hard_negatives(positive, scene, rng, len(KINDS)) if n.text.startswith(f"{base} ")]
    return rng.choice(edits) if edits else None


def text_edited_unit(base: str, unit: str, editor: TextEditor, rng: random.Random) -> str | None:
    """c_j + d+ with d+ edited by text alone (one noun, attribute, count or relation changed)."""
    edits = editor.edits(unit, rng, 1)
    return f"{base} {edits[0].text}" if edits else None


def specs_step(pair: torch.nn.Module, batch: dict, cfg: TrainSpecsConfig) -> tuple[torch.Tensor, dict[str, float]]:
    tokens, mask = batch["tokens"], batch["mask"]
    b, t, length = tokens.shape
    flat = tokens.view(b * t, length)
    image, text, scale, _ = pair(batch["images"], flat, prefix_tree(flat, t))  # triplets are the caption's prefixes
    image = gather_with_grad(F.normalize(image.float(), dim=-1))
    text = gather_with_grad(F.normalize(text.float(), dim=-1).view(b, t, -1))
    mask = gather_with_grad(mask)
    keep = [0, *range(TRIPLET, t)]
    contrastive = negclip_loss(image, text[:, keep], mask[:, keep], scale)
    return specs_loss(scale, image, text[:, 0], text[:, 1], text[:, 2], text[:, 3], cfg, contrastive)


def with_units(dataset: str, split: Split) -> Split:
    """The images whose long caption has at least two detail units (triplets need them)."""
    rows = [k for k, e in enumerate(split.entries) if detail_units_of(e)]
    if len(rows) < 2:
        raise DataError(f"{dataset}: fewer than two training images have long captions with >= 2 detail units "
                        "('long_captions': [{'raw', 'detail_units'}]); segment captions with rewards.detail_units")
    return split.subset(rows)


def _validate(cfg: TrainSpecsConfig) -> None:
    require_keys(cfg, ("init", "dataset", "images_root", "out"), "train_specs")
    if cfg.negatives == "world" and not cfg.scenes:
        raise ConfigError("negatives: world needs 'scenes' (the world's scenes.json)")
    check_text_edits(cfg.text_edits)
    if cfg.edited_negatives and not cfg.scenes and cfg.negatives != "text":
        raise ConfigError("edited_negatives needs 'scenes' (the world's scenes.json), where edits are checked false, "
                          "or negatives: text, which edits the unit by its words alone")
