"""The offline world's own supervision for `train_clip`: what only a world with scene graphs can feed.

Scene labels and grid cells on the image tower, the bare nouns, object phrases and relation phrases
grounded in the images that hold them, the text stage of statements made from scenes, hard text
negatives checked false against `scenes.json`, counterfactual renders and mirrored twins. None of it
exists for COCO; on the world it is what makes the reward models see (docs/offline_world.md). It lives
in the config's `world:` section, so the general recipe (rewards/recipes/clip.py) reads without it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch

from features.clip_models.tokens import ClipTokenizer
from features.world.counterfactual import counterfactual, rerender
from features.world.negatives import KINDS, hard_negatives
from features.world.parse import parse_caption
from features.world.scene import Scene
from plumbing.config import option
from plumbing.errors import ConfigError
from rewards.recipes.attribute_facts import ATTRIBUTES
from rewards.recipes.data import Split
from rewards.recipes.grounding import PHRASE_ATTRIBUTES, Grounding, NounTargets
from rewards.recipes.loop import RecipeRun
from rewards.recipes.mirror import AXES, MirrorMode
from rewards.recipes.scene_labels import BLOCKS, LABEL_GROUPS, label_columns, pretrain_on_scene_labels, scene_labels
from rewards.recipes.text_stage import TextStagePlan


@dataclass
class WorldSupervision:
    """The offline world's supervision: options that read its scene graphs (`scenes`); all off by default."""

    image_negatives: Literal["none", "world"] = option(
        "none", help="hard image negatives: none, or world (each image's scene with one fact that its caption "
        "states changed, rendered and checked false of the caption by the world parser; needs `scenes`)")
    negative_kinds: list[str] = option(factory=lambda: list(KINDS), help="the kinds of fact a negative may change")
    vision_pretrain_epochs: int = option(
        0, help="epochs of supervised pretraining of the image tower on the world's scene graphs (`scenes`, train "
        "split) before the contrastive stage: a linear head predicts which objects (shape, colour) the image "
        "holds with each one's size, texture and place, the background and the count (LiT-style)", at_least=0)
    vision_map_labels: float = option(
        0.0, help="with vision_pretrain_epochs: weight of labels read off each place of the image tower's last "
        "feature map (the shape, colour, size and texture of what is centred there), besides the scene labels "
        "read off the embedding (0: off)", at_least=0)
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


def validate_world(world: WorldSupervision, scenes: str | None, lock_image_tower: bool) -> None:
    """The world section's settings against each other and against the general ones they lean on."""
    needs_scenes = [("image_negatives: world", world.image_negatives == "world"),
                    ("vision_pretrain_epochs", world.vision_pretrain_epochs),
                    ("noun_loss", world.noun_loss), ("phrase_loss", world.phrase_loss),
                    ("relation_loss", world.relation_loss), ("the text stage (text_*_epochs)", text_epochs(world))]
    if not scenes and (missing := [name for name, used in needs_scenes if used]):
        raise ConfigError(f"world.{missing[0]} needs 'scenes' (the world's scenes.json: what each image holds)")
    if world.vision_map_labels and not world.vision_pretrain_epochs:
        raise ConfigError("world.vision_map_labels is read during the scene-label stage: set "
                          "world.vision_pretrain_epochs too")
    if world.scene_label_loss and not world.vision_pretrain_epochs:
        raise ConfigError("world.scene_label_loss keeps training the scene-label stage's head: set "
                          "world.vision_pretrain_epochs")
    if world.scene_label_loss and lock_image_tower:
        raise ConfigError("world.scene_label_loss trains the image tower, which lock_image_tower keeps as it starts")
    unknown = sorted(set(world.scene_label_groups) - set(LABEL_GROUPS))
    if unknown or not world.scene_label_groups:
        problem = f"unknown group {unknown[0]!r}" if unknown else "no group named"
        raise ConfigError(f"world.scene_label_groups: {problem}; the groups are {', '.join(LABEL_GROUPS)}")
    for key in ("relation_loss", "scene_label_loss"):
        if getattr(world, key) and world.mirror != "none":
            raise ConfigError(f"world.{key} reads relations and places off the unflipped scenes; it cannot be used "
                              "with world.mirror")
    for key, known in (("mirror_axes", AXES), ("negative_kinds", KINDS), ("phrase_attributes", PHRASE_ATTRIBUTES),
                       ("text_pairs_axes", AXES), ("text_attributes", ATTRIBUTES)):
        if unknown := sorted(set(getattr(world, key)) - set(known)):
            raise ConfigError(f"world.{key}: unknown {unknown}; known: {', '.join(known)}")
    if world.mirror != "none" and not world.mirror_axes:
        raise ConfigError(f"world.mirror: {world.mirror} needs at least one of world.mirror_axes ({', '.join(AXES)})")
    if "shape" not in world.phrase_attributes:
        raise ConfigError("world.phrase_attributes: shape is missing; an object phrase names its shape")


def text_epochs(world: WorldSupervision) -> int:
    return world.text_roles_epochs + world.text_pairs_epochs + world.text_negclip_epochs


def text_stage_plan(world: WorldSupervision, train: Split, captions: str, hard_negatives: int) -> TextStagePlan:
    return TextStagePlan(
        roles_epochs=world.text_roles_epochs, pairs_epochs=world.text_pairs_epochs,
        negclip_epochs=world.text_negclip_epochs, batch_size=world.text_batch_size,
        roles_batch_size=world.text_roles_batch_size, negclip_batch_size=world.text_negclip_batch_size,
        lr=world.text_lr, pair_axes=tuple(world.text_pairs_axes), attributes=tuple(world.text_attributes),
        long_rate=world.text_long_statements, long_share=world.text_long_captions, other_frames=world.text_other_frames,
        caption_pool=train.pool(captions), hard_negatives=hard_negatives, negative_kinds=tuple(world.negative_kinds))


def pretrain_vision(run: RecipeRun, model: torch.nn.Module, train: Split, transform, scenes: dict[int, Scene],
                    world: WorldSupervision, arch: str) -> torch.nn.Linear:
    """The image tower trained to predict the scene labels (rewards.recipes.scene_labels) before
    the contrastive stage; returns the labels' head."""
    width = getattr(model.visual, "output_dim", None)
    if not isinstance(width, int):
        raise ConfigError(f"world.vision_pretrain_epochs: cannot tell the output width of {arch}'s image tower "
                          "(open_clip's ResNet and ViT towers have one)")
    return pretrain_on_scene_labels(run, model.visual, width, train, transform, scenes, world.vision_pretrain_epochs,
                                    world.vision_map_labels)


def kept_scene_labels(train: Split, scenes: dict[int, Scene], world: WorldSupervision
                      ) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(labels [train rows, kept], kept columns, weight) for the scene-label loss of the contrastive stage."""
    if not world.scene_label_loss:
        return None
    columns = label_columns(world.scene_label_groups)
    return scene_labels(train, scenes)[:, columns], columns, world.scene_label_loss


def groundings(train: Split, scenes: dict[int, Scene], tokenizer: ClipTokenizer, world: WorldSupervision
               ) -> list[tuple[Grounding, float]]:
    """The nouns, object phrases and relation phrases grounded beside the contrastive loss, with their weights."""
    nouns = partial(Grounding.shape_nouns, targets=world.noun_targets)
    phrases = partial(Grounding.object_phrases, attributes=world.phrase_attributes)
    return [(build(train, scenes, tokenizer), weight) for build, weight in
            ((nouns, world.noun_loss), (phrases, world.phrase_loss),
             (Grounding.relation_phrases, world.relation_loss)) if weight]


def checked_negatives(split: Split, scenes: dict[int, Scene], count: int, kinds: tuple[str, ...]):
    """negatives(caption, row, rng): the caption with one fact changed, each checked false of the row's scene."""

    def negatives(caption: str, row: int, rng: random.Random) -> list[str]:
        scene = scenes[split.image_ids[row]]
        return [n.text for n in hard_negatives(caption, scene, rng, count, kinds)]

    return negatives


def counterfactual_images(split: Split, scenes: dict[int, Scene], world_seed: int | None):
    """image_negative(row, rng, caption): the row's scene with one fact the caption states changed,
    drawn with the original's background and noise (None when no edit contradicts the caption)."""

    def image_negative(row: int, rng: random.Random, caption: str):
        image_id = split.image_ids[row]
        edited = counterfactual(scenes[image_id], parse_caption(caption), rng)
        return None if edited is None else rerender(scenes[image_id], edited, world_seed, image_id)

    return image_negative
