"""Bare shape nouns grounded in the images that hold them (`noun_loss` of train_clip).

F-CLIPScore averages a caption's CLIP-S with the CLIP-S of each of its nouns alone ("star"). A
CLIP trained on web alt-text has met bare nouns; a CLIP trained on the world's captions only meets
whole sentences, so a bare noun's cosine to an image says more about the word than about the image
(the docs' figures: an absent "square" can outscore a present "circle"). This loss gives the text
tower the bare nouns: for each image, a softmax over every shape word of the world (each synonym,
singular and plural) whose target spreads evenly over the words of the shapes the image holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from features.clip_models.tokens import ClipTokenizer
from features.world import lexicon
from features.world.scene import Scene
from plumbing.errors import DataError
from rewards.recipes.data import Split


@dataclass
class NounGrounding:
    words: list[str]
    tokens: torch.Tensor   # [V, L] token ids of the bare words
    targets: torch.Tensor  # [rows of the train split, V]; each row sums to 1 over the words it holds

    @classmethod
    def build(cls, split: Split, scenes: dict[int, Scene], tokenizer: ClipTokenizer) -> NounGrounding:
        nouns = list(lexicon.shape_word_index().items())
        missing = [image_id for image_id in split.image_ids if image_id not in scenes]
        if missing:
            raise DataError(f"noun_loss: image id {missing[0]} of the train split has no scene in `scenes`")
        shapes_held = [{obj.shape for obj in scenes[image_id].objects} for image_id in split.image_ids]
        held = torch.tensor([[float(shape in shapes) for _, shape in nouns] for shapes in shapes_held])
        counts = held.sum(1, keepdim=True)
        if (counts == 0).any():
            image_id = split.image_ids[int((counts[:, 0] == 0).nonzero()[0])]
            raise DataError(f"noun_loss: the scene of image id {image_id} holds no shape")
        words = [word for word, _ in nouns]
        return cls(words, tokenizer.padded(tokenizer.ids(words)), held / counts)

    def loss(self, image: torch.Tensor, nouns: torch.Tensor, logit_scale: torch.Tensor,
             rows: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of each image [B, d] over the noun embeddings [V, d] (both normalised)."""
        logits = logit_scale.exp() * image @ nouns.t()
        target = self.targets[rows.cpu()].to(image.device)  # only the batch's rows travel, not the table
        return -(target * logits.log_softmax(-1)).sum(-1).mean()
