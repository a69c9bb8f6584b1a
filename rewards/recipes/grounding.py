"""Short texts grounded in the images they are true of (`noun_loss` and `phrase_loss` of train_clip).

Each image gets a softmax over a fixed list of short texts whose target spreads evenly over the
texts true of its scene (from scenes.json):
- **Bare shape nouns** (`noun_loss`): every shape word of the world, each synonym singular and
  plural ("disc", "stars"). F-CLIPScore averages a caption's CLIP-S with the CLIP-S of each of its
  nouns alone; a CLIP trained on web alt-text has met bare nouns, one trained on the world's
  captions only meets whole sentences, so a bare noun's cosine says more about the word than about
  the image (docs/reward_models.md: an absent "square" outscored a present "circle").
- **Object phrases** (`phrase_loss`): "a small red striped circle", one for every combination of
  size, colour, texture and shape (canonical words). An object's phrase must beat the phrases that
  differ from it in one attribute, which is what a changed fact does to a caption; in-batch captions
  rarely differ from each other that way, so the contrastive loss alone says little about it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from features.clip_models.tokens import ClipTokenizer
from features.world import lexicon
from features.world.scene import Scene, WorldObject
from plumbing.errors import DataError
from rewards.recipes.data import Split


@dataclass
class Grounding:
    name: str              # the config key it answers to, for errors and logs
    words: list[str]       # the texts
    tokens: torch.Tensor   # [V, L] their token ids
    targets: torch.Tensor  # [rows of the train split, V]; each row sums to 1 over the texts true of it

    @classmethod
    def shape_nouns(cls, split: Split, scenes: dict[int, Scene], tokenizer: ClipTokenizer) -> Grounding:
        nouns = list(lexicon.shape_word_index().items())
        return cls._build("noun_loss", [word for word, _ in nouns], [shape for _, shape in nouns],
                          lambda obj: obj.shape, split, scenes, tokenizer)

    @classmethod
    def object_phrases(cls, split: Split, scenes: dict[int, Scene], tokenizer: ClipTokenizer) -> Grounding:
        combos = list(itertools.product(lexicon.SIZES, lexicon.COLORS, lexicon.TEXTURES, lexicon.SHAPES))
        return cls._build("phrase_loss", [f"a {' '.join(combo)}" for combo in combos], combos,
                          lambda obj: (obj.size, obj.color, obj.texture, obj.shape), split, scenes, tokenizer)

    @classmethod
    def _build(cls, name: str, words: list[str], keys: Sequence, key_of: Callable[[WorldObject], object],
               split: Split, scenes: dict[int, Scene], tokenizer: ClipTokenizer) -> Grounding:
        """`keys[i]` is what text i says of one object; an image holds the texts whose key is one
        of its objects' `key_of`."""
        missing = [image_id for image_id in split.image_ids if image_id not in scenes]
        if missing:
            raise DataError(f"{name}: image id {missing[0]} of the train split has no scene in `scenes`")
        held_keys = [{key_of(obj) for obj in scenes[image_id].objects} for image_id in split.image_ids]
        held = torch.tensor([[float(key in keys_of_image) for key in keys] for keys_of_image in held_keys])
        counts = held.sum(1, keepdim=True)
        if (counts == 0).any():
            image_id = split.image_ids[int((counts[:, 0] == 0).nonzero()[0])]
            raise DataError(f"{name}: the scene of image id {image_id} holds no object")
        return cls(name, words, tokenizer.padded(tokenizer.ids(words)), held / counts)

    def loss(self, image: torch.Tensor, texts: torch.Tensor, logit_scale: torch.Tensor,
             rows: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of each image [B, d] over the text embeddings [V, d] (both normalised)."""
        logits = logit_scale.exp() * image @ texts.t()
        target = self.targets[rows.cpu()].to(image.device)  # only the batch's rows travel, not the table
        return -(target * logits.log_softmax(-1)).sum(-1).mean()
