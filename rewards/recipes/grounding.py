"""Short texts grounded in the images they are true of (`noun_loss` and `phrase_loss` of train_clip).

Each image gets a softmax over a fixed list of short texts whose target spreads evenly over the
texts true of its scene (from scenes.json):
- **Bare shape nouns** (`noun_loss`): every shape word of the world, each synonym singular and
  plural ("disc", "stars"). F-CLIPScore averages a caption's CLIP-S with the CLIP-S of each of its
  nouns alone; a CLIP trained on web alt-text has met bare nouns, one trained on the world's
  captions only meets whole sentences, so a bare noun's cosine says more about the word than about
  the image (docs/lab_book.md: an absent "square" outscored a present "circle").
  With `presence` (`noun_targets: presence`) each noun of a shape the image holds gets its own
  softmax against the nouns of the shapes it lacks, in place of one softmax whose target is spread
  over every present noun: each object of a crowded scene then counts in full (with the spread
  target, each of four shapes gets a quarter), which is the question F-CLIPScore asks of a noun
  and a shape foil asks of a caption: is this shape there or not. `presence_floor` also puts cosine 0
  among each softmax's rivals: F-CLIPScore scores a noun 2.5 max(cos, 0), so a present noun under 0
  counts as nothing, and the plain presence softmax, which only ranks an image's nouns, leaves most
  present nouns of three- and four-object scenes there (docs/lab_book.md, "Nouns above cosine 0").
- **Object phrases** (`phrase_loss`): "a small red striped circle", one for every combination of
  size, colour, texture and shape (canonical words; `phrase_attributes` can leave out all but the
  shape). An object's phrase must beat the phrases that differ from it in one attribute, which is what
  a changed fact does to a caption; in-batch captions rarely differ from each other that way, so the
  contrastive loss alone says little about it.
- **Relation phrases** (`relation_loss`): "a circle to the left of a star" and "a red shape to the
  left of a blue shape", for every two shapes (colours) and relation. The softmax runs only over the
  phrases that name two of the image's own shapes (colours), so a true phrase competes with its
  inverse and the pair the other way round, which only where things are tells apart (over all 452,
  naming the right objects is most of the loss and the relations were barely learned). Every relation
  word is as often true as false (each relation holds with its inverse seen from the other object),
  so no word prior can stand in for the image. Images of one object hold no relation and sit out.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F

from features.clip_models.tokens import ClipTokenizer
from features.world import lexicon
from features.world.scene import Scene, WorldObject
from plumbing.errors import DataError
from rewards.recipes.data import Split

NounTargets = Literal["spread", "presence", "presence_floor"]  # train_clip's noun_targets

PHRASE_ATTRIBUTES = ("size", "color", "texture", "shape")  # an object phrase's words, in the captions' order
_ATTRIBUTE_VALUES = {"size": tuple(lexicon.SIZES), "color": tuple(lexicon.COLORS), "texture": lexicon.TEXTURES,
                     "shape": tuple(lexicon.SHAPES)}


@dataclass
class Grounding:
    name: str              # the config key it answers to, for errors and logs
    words: list[str]       # the texts
    tokens: torch.Tensor   # [V, L] their token ids
    targets: torch.Tensor  # [rows of the train split, V]; each row sums to 1 over the texts true of it
    candidates: torch.Tensor | None = None  # [rows, V] the texts each row's softmax runs over (None: all)
    presence: bool = False  # each text true of the image in its own softmax against the false ones
    floor: bool = False     # with presence: cosine 0 is one more rival of each true text

    @classmethod
    def shape_nouns(cls, split: Split, scenes: dict[int, Scene], tokenizer: ClipTokenizer,
                    targets: NounTargets = "spread") -> Grounding:
        """`targets`: spread (one softmax, the target spread over the present nouns), presence (each
        present noun against the absent ones) or presence_floor (and against cosine 0)."""
        nouns = list(lexicon.shape_word_index().items())
        grounding = cls._build("noun_loss", [word for word, _ in nouns], [shape for _, shape in nouns],
                               _each_object(lambda obj: obj.shape), split, scenes, tokenizer)
        return replace(grounding, presence=targets != "spread", floor=targets == "presence_floor")

    @classmethod
    def object_phrases(cls, split: Split, scenes: dict[int, Scene], tokenizer: ClipTokenizer,
                       attributes: Sequence[str] = PHRASE_ATTRIBUTES) -> Grounding:
        """`attributes`: which of PHRASE_ATTRIBUTES the phrases name, in that order ("shape" always)."""
        named = [name for name in PHRASE_ATTRIBUTES if name in attributes]
        combos = list(itertools.product(*(_ATTRIBUTE_VALUES[name] for name in named)))
        return cls._build("phrase_loss", [f"a {' '.join(combo)}" for combo in combos], combos,
                          _each_object(lambda obj: tuple(getattr(obj, name) for name in named)),
                          split, scenes, tokenizer)

    @classmethod
    def relation_phrases(cls, split: Split, scenes: dict[int, Scene], tokenizer: ClipTokenizer) -> Grounding:
        words, keys = [], []
        for noun, names in (("{} shape", lexicon.COLORS), ("{}", lexicon.SHAPES)):
            for a, relation, b in itertools.product(names, lexicon.RELATIONS, names):
                phrase = lexicon.RELATION_PHRASES[relation][0]
                words.append(f"a {noun.format(a)} {phrase} a {noun.format(b)}")
                keys.append((a, relation, b))
        return cls._build("relation_loss", words, keys, _relations_held, split, scenes, tokenizer,
                          allow_none=True, candidates_of=_relations_about_own_objects)

    @classmethod
    def _build(cls, name: str, words: list[str], keys: Sequence, keys_of: Callable[[Scene], set],
               split: Split, scenes: dict[int, Scene], tokenizer: ClipTokenizer, allow_none: bool = False,
               candidates_of: Callable[[Scene], set] | None = None) -> Grounding:
        """`keys[i]` is what text i says; an image holds the texts whose key is in `keys_of` its
        scene. With `allow_none`, an image that holds none gets a zero row (it sits the loss out).
        `candidates_of` narrows each image's softmax to the texts whose key is in it (None: all)."""
        missing = [image_id for image_id in split.image_ids if image_id not in scenes]
        if missing:
            raise DataError(f"{name}: image id {missing[0]} of the train split has no scene in `scenes`")
        split_scenes = [scenes[image_id] for image_id in split.image_ids]
        held = _indicator(keys, map(keys_of, split_scenes))
        counts = held.sum(1, keepdim=True)
        if not allow_none and (counts == 0).any():
            image_id = split.image_ids[int((counts[:, 0] == 0).nonzero()[0])]
            raise DataError(f"{name}: the scene of image id {image_id} holds no object")
        candidates = None if candidates_of is None else _indicator(keys, map(candidates_of, split_scenes)).bool()
        return cls(name, words, tokenizer.padded(tokenizer.ids(words)), held / counts.clamp(min=1), candidates)

    def loss(self, image: torch.Tensor, texts: torch.Tensor, logit_scale: torch.Tensor,
             rows: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of each image [B, d] over the text embeddings [V, d] (both normalised)."""
        logits = logit_scale.exp() * image @ texts.t()
        rows = rows.cpu()
        target = self.targets[rows].to(image.device)  # only the batch's rows travel, not the table
        if self.presence:  # only the nouns have it, and they take every text as a candidate
            return presence_loss(logits, target > 0, self.floor)
        if self.candidates is None:  # every row sums to 1: the plain mean (the spread noun loss, bit for bit)
            return -(target * logits.log_softmax(-1)).sum(-1).mean()
        logits = logits.masked_fill(~self.candidates[rows].to(image.device), float("-inf"))
        log_p = logits.log_softmax(-1).masked_fill(target == 0, 0.0)  # no 0 * -inf
        return -(target * log_p).sum() / target.sum().clamp(min=1)  # a row sums to 1, or to 0 where it sits out


def presence_loss(logits: torch.Tensor, present: torch.Tensor, floor: bool = False) -> torch.Tensor:
    """Mean over the present texts of each one's cross-entropy in a softmax over itself and the
    absent texts of its image, -log(e^l_p / (e^l_p + sum over absent e^l_a)): logits [B, V], present
    [B, V] bool. The other present texts are left out of that softmax, so none competes with another.
    `floor`: a logit of 0 (cosine 0) joins the absent ones."""
    absent = logits.masked_fill(present, float("-inf")).logsumexp(-1, keepdim=True)
    if floor:
        absent = torch.logaddexp(absent, torch.zeros_like(absent))
    return F.softplus(absent - logits)[present].mean()


def _each_object(key_of: Callable[[WorldObject], object]) -> Callable[[Scene], set]:
    return lambda scene: {key_of(obj) for obj in scene.objects}


def _indicator(keys: Sequence, key_sets) -> torch.Tensor:
    """[images, keys]: 1 where the image's set holds the key."""
    return torch.tensor([[float(key in held) for key in keys] for held in key_sets])


def _relations_about_own_objects(scene: Scene) -> set:
    """Every (shape, relation, shape) and (colour, relation, colour) naming two of the scene's own
    shapes (colours), true or not."""
    own = ({obj.shape for obj in scene.objects}, {obj.color for obj in scene.objects})
    return {(a, relation, b) for names in own for a, b in itertools.product(names, names)
            for relation in lexicon.RELATIONS}


def _relations_held(scene: Scene) -> set:
    """(shape, relation, shape) and (colour, relation, colour) of every relation in the scene."""
    objects = {obj.id: obj for obj in scene.objects}
    held = set()
    for fact in scene.relations:
        a, b = objects[fact["subject"]], objects[fact["object"]]
        held |= {(a.shape, fact["relation"], b.shape), (a.color, fact["relation"], b.color)}
    return held
