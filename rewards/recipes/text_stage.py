"""A text stage after train_clip's contrastive stage: the text tower learns to read spatial
relations against the image tower it was trained with, held frozen (docs/lab_book.md, "The text
stage in `train_clip`").

A contrastive stage leaves relation words nearly unread: captions of one image that differ only in
"above" / "below" embed almost alike, whatever the image holds. Three phases follow it, each a stage
of the recipe loop (resumable at its epochs' ends), all on the train split's scenes:

1. **roles** (`text_roles_epochs`): from a relation statement alone ("a red disc above a blue star"),
   a linear head on the text embedding predicts which relation each named colour and shape stands in
   (the subject's names take the relation, the object's its inverse). A text-only task that makes the
   tower keep who is above whom; without it the pairs below stayed at chance far longer (docs). It runs
   at a constant rate (`ROLES_SCHEDULE`) and `text_roles_batch_size` statements a step.
2. **pairs** (`text_pairs_epochs`): a statement about two of the image's objects against the same
   words with the inverse relation, both against the image's frozen embedding (centred on the train
   images' mean, so what all images share does not drown the difference): the true one must score
   higher. A share of the statements (`text_long_statements`; none by default) takes the long
   captions' wording. The roles stay on. With `text_attributes`, attribute pairs join them: one
   object's size, place or texture, or the scene's background, against the same words with it
   changed (rewards/recipes/attribute_facts.py).
3. **negclip** (`text_negclip_epochs`): each image's caption with its world hard negatives, NegCLIP
   against the frozen embeddings, so the tower keeps reading everything else; two of the image's own
   relation pairs and their roles stay on beside it, and one of its attribute pairs when there are any.
   With `text_long_captions`, that share of the images takes one of its long captions: the pairs'
   short statements teach a relation alone, and a long caption's relation among its other facts is
   learned only from long captions (docs/lab_book.md, "Long captions in the NegCLIP phase").
   `text_negclip_batch_size` gives the phase its own batch (docs/lab_book.md, "The NegCLIP
   phase at twice the batch and twice the epochs").

Every statement names the objects by colour and shape; a fact is left out where that is ambiguous
(two objects that look alike, or other look-alikes holding the inverse relation), since its "false"
statement would be true of the scene.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from features.clip_models.text_batches import PrefixTree, prefix_tree
from features.clip_models.tokens import ClipTokenizer
from features.world import lexicon
from features.world.captions import SOLID_FILL, article
from features.world.negatives import hard_negatives
from features.world.scene import Scene, WorldObject
from plumbing.errors import DataError
from rewards.recipes.attribute_facts import LEADS, AttributeFact, attribute_facts, attribute_pair
from rewards.recipes.contrastive import gather_with_grad, negclip_loss
from rewards.recipes.data import Split, embed_split_images, pick
from rewards.recipes.loop import PairEncoder, RecipeRun, Stage
from rewards.recipes.training import lock

AXIS_RELATIONS = {"horizontal": ("left of", "right of"), "vertical": ("above", "below")}
ROLE_NAMES = (*lexicon.COLORS, *lexicon.SHAPES)  # what a statement names an object by
ROLE_SLOT = {name: k for k, name in enumerate(ROLE_NAMES)}
PAIRS_PER_IMAGE = 2  # relation pairs beside each image's caption in the negclip phase
# The roles sit at the level of knowing the names and the relation but not who is the subject for a
# few hundred steps, then fall to near zero; a rate decaying to 0 over the phase stalls them on that
# plateau, and the pairs after it then wait there too (docs/lab_book.md, "The roles phase at a
# steady rate").
ROLES_SCHEDULE = "constant"


class RelationFact(NamedTuple):
    row: int  # the image's row in the train split
    subject: WorldObject
    relation: str
    object: WorldObject
    others: tuple[WorldObject, ...]  # the scene's other objects


def relation_facts(split: Split, scenes: dict[int, Scene], relations: Sequence[str] = lexicon.RELATIONS
                   ) -> list[RelationFact]:
    """Every relation the split's scenes record that a statement naming colours and shapes states
    unambiguously (Scene.nameable_relations)."""
    facts = []
    for row, image_id in enumerate(split.image_ids):
        if image_id not in scenes:
            raise DataError(f"text stage: image id {image_id} of the train split has no scene in `scenes`")
        scene = scenes[image_id]
        for subject, relation, obj in scene.nameable_relations():
            if relation in relations:
                others = tuple(o for o in scene.objects if o.id not in (subject.id, obj.id))
                facts.append(RelationFact(row, subject, relation, obj, others))
    return facts


Fact = RelationFact | AttributeFact


def roles(fact: Fact) -> torch.Tensor:
    """[names x relations] flattened: 1 where a name stands in that relation in the fact (nowhere for
    an attribute fact, which states no relation)."""
    target = torch.zeros(len(ROLE_NAMES), len(lexicon.RELATIONS))
    if isinstance(fact, AttributeFact):
        return target.flatten()
    for names, relation in (((fact.subject.color, fact.subject.shape), fact.relation),
                            ((fact.object.color, fact.object.shape), lexicon.INVERSE[fact.relation])):
        for name in names:
            target[ROLE_SLOT[name], lexicon.RELATIONS.index(relation)] = 1.0
    return target.flatten()


def statement_pair(fact: Fact, rng: random.Random, long_rate: float, other_frames: float = 0.0
                   ) -> tuple[str, str]:
    """The fact stated, and the same words with the inverse relation, or the attribute changed
    (false of the scene). `other_frames` of the relation statements take one of OTHER_FRAMES (no
    draw is spent at 0, so those runs draw the texts they drew before the option)."""
    if isinstance(fact, AttributeFact):
        return attribute_pair(fact, rng)
    if other_frames and rng.random() < other_frames:
        return _other_frame_pair(fact, rng)
    if rng.random() < long_rate:
        opening = f"{_article(_long_words(fact.subject, rng)).capitalize()} {_texture_unit(fact.subject, rng)}. It is "
        closing = f" the {_long_words(fact.object, rng)}."
    else:
        lead = rng.choice(LEADS)
        opening = f"{lead}{_article(_short_words(fact.subject, rng))} "
        closing = f" {_article(_short_words(fact.object, rng))}"
        if fact.others and lead and rng.random() < 0.5:
            closing += " and " + ", ".join(_article(_short_words(o, rng)) for o in fact.others)
    true, false = fact.relation, lexicon.INVERSE[fact.relation]
    return (f"{opening}{rng.choice(lexicon.RELATION_PHRASES[true])}{closing}",
            f"{opening}{rng.choice(lexicon.RELATION_PHRASES[false])}{closing}")


# Relation statements whose subject is not simply the first object named (`text_other_frames`): the
# world's captions all name it first, and a tower trained on them alone reads the subject by word
# order (docs/lab_book.md, "Relations in other frames"). Filled with (subject, object, relation).
OTHER_FRAMES = (
    lambda a, b, a_the, b_the, rel: f"{a_the} is {rel} {b_the}",   # the red circle is above the blue star
    lambda a, b, a_the, b_the, rel: f"{rel} {b} is {a}",             # above a blue star is a red circle
    lambda a, b, a_the, b_the, rel: f"{b} with {a} {rel} it",        # a blue star with a red circle above it
    lambda a, b, a_the, b_the, rel: f"{a} that is {rel} {b}",        # a red circle that is above a blue star
)


def _other_frame_pair(fact: RelationFact, rng: random.Random) -> tuple[str, str]:
    a, b = _article(_short_words(fact.subject, rng)), _article(_short_words(fact.object, rng))
    a_the, b_the = f"the {_short_words(fact.subject, rng)}", f"the {_short_words(fact.object, rng)}"
    frame = rng.choice(OTHER_FRAMES)
    true, false = fact.relation, lexicon.INVERSE[fact.relation]
    return (frame(a, b, a_the, b_the, rng.choice(lexicon.RELATION_PHRASES[true])),
            frame(a, b, a_the, b_the, rng.choice(lexicon.RELATION_PHRASES[false])))


def _short_words(obj: WorldObject, rng: random.Random) -> str:
    color = lexicon.COLOR_WORDS[obj.color]
    return f"{color[0] if rng.random() < 0.8 else rng.choice(color)} {rng.choice(lexicon.SHAPES[obj.shape])}"


def _long_words(obj: WorldObject, rng: random.Random) -> str:
    size = rng.choice(lexicon.SIZE_WORDS[obj.size][:2])
    return f"{size} {lexicon.COLOR_WORDS[obj.color][0]} {rng.choice(lexicon.SHAPES[obj.shape])}"


def _texture_unit(obj: WorldObject, rng: random.Random) -> str:
    """The long captions' texture unit, drawn from this stage's rng (the generator's takes numpy's)."""
    if obj.texture == "solid":
        return rng.choice(SOLID_FILL)
    return f"with a {obj.texture} pattern"


def _article(words: str) -> str:
    return f"{article(words)} {words}"


class TextItem(NamedTuple):
    row: int                       # the image the texts are about
    group: list[str]               # a caption, then its hard negatives (negclip phase; else empty)
    pairs: list[tuple[str, ...]]   # (true statement, its inverse), or (true,) alone in the roles phase
    roles: list[torch.Tensor]      # each pair's role targets


class SeededItems(Dataset):
    """Items drawn with an rng seeded by (seed, epoch, item), as TextsDataset's: a resumed run, or
    another number of workers or processes, draws the same texts."""

    def __init__(self, seed: int):
        self.seed = seed
        self._epoch = torch.zeros(1, dtype=torch.long).share_memory_()  # seen by persistent workers too

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = epoch

    def rng(self, item: int) -> random.Random:
        return random.Random(f"{self.seed}-{int(self._epoch[0])}-{item}")


class FactsDataset(SeededItems):
    """Items: one fact each, stated as a pair (or, `true_only`, its true statement alone)."""

    def __init__(self, facts: Sequence[Fact], seed: int, long_rate: float, true_only: bool = False,
                 other_frames: float = 0.0):
        if not facts:
            raise DataError("text stage: the train split's scenes hold no relation between two objects a "
                            "statement can tell apart")
        super().__init__(seed)
        self.facts, self.long_rate, self.true_only, self.other_frames = facts, long_rate, true_only, other_frames

    def __len__(self) -> int:
        return len(self.facts)

    def __getitem__(self, k: int) -> TextItem:
        rng = self.rng(k)
        fact = self.facts[k]
        pair = statement_pair(fact, rng, self.long_rate, self.other_frames)
        return TextItem(fact.row, [], [pair[:1] if self.true_only else pair], [roles(fact)])


class CaptionsDataset(SeededItems):
    """Items: one train image each, its caption with `hard_negatives` world negatives, up to
    PAIRS_PER_IMAGE of its own relation facts stated as pairs and, when `facts` hold attribute facts,
    one of its own of those."""

    def __init__(self, split: Split, pools: list[list[str]], scenes: dict[int, Scene], facts: Sequence[Fact],
                 seed: int, hard: int, kinds: tuple[str, ...], long_rate: float, long_share: float = 0.0,
                 other_frames: float = 0.0):
        super().__init__(seed)
        self.split, self.pools, self.scenes = split, pools, scenes
        self.hard, self.kinds, self.long_rate, self.long_share = hard, kinds, long_rate, long_share
        self.other_frames = other_frames
        self.facts_of: list[list[RelationFact]] = [[] for _ in range(len(split))]
        self.attributes_of: list[list[AttributeFact]] = [[] for _ in range(len(split))]
        for fact in facts:
            (self.attributes_of if isinstance(fact, AttributeFact) else self.facts_of)[fact.row].append(fact)

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, row: int) -> TextItem:
        rng = self.rng(row)
        caption = self._caption(row, rng)
        scene = self.scenes[self.split.image_ids[row]]
        group = [caption, *(n.text for n in hard_negatives(caption, scene, rng, self.hard, self.kinds))]
        own = self.facts_of[row]
        chosen: list[Fact] = [rng.choice(own) for _ in range(PAIRS_PER_IMAGE)] if own else []
        if self.attributes_of[row]:  # drawn after the relations: without attributes, the same texts as before
            chosen.append(rng.choice(self.attributes_of[row]))
        pairs = [statement_pair(fact, rng, self.long_rate, self.other_frames) for fact in chosen]
        return TextItem(row, group, pairs, [roles(fact) for fact in chosen])

    def _caption(self, row: int, rng: random.Random) -> str:
        """One of the image's long captions `long_share` of the time (when it has one), else one from its
        pool. No draw is spent at share 0, so those runs draw the texts they drew before the option."""
        if self.long_share and self.split.long[row] and rng.random() < self.long_share:
            return pick(self.split.long[row], rng)
        return pick(self.pools[row], rng)


class TextItemBatcher:
    """Collates TextItems into {"rows" [B], "tokens" [B, T, L], "mask" [B, T], "pair_tokens" [B, K, S, L],
    "pair_mask" [B, K], "roles" [B, K, R]}: every tensor has one row per item, so accelerate splits a
    global batch across processes along the item axis."""

    def __init__(self, tokenizer: ClipTokenizer):
        self.tokenizer = tokenizer

    def __call__(self, items: list[TextItem]) -> dict:
        groups = max(len(item.group) for item in items)
        pairs = max(len(item.pairs) for item in items)
        sides = max((len(pair) for item in items for pair in item.pairs), default=1)
        slots = [_slot(item.group, t) for item in items for t in range(groups)]
        slots += [_slot(_slot(item.pairs, k) or (), side)
                  for item in items for k in range(pairs) for side in range(sides)]
        known = iter(self.tokenizer.ids([text for text in slots if text is not None]))
        rows = [next(known) if text is not None else [] for text in slots]
        flat = self.tokenizer.padded(rows, max(max(map(len, rows), default=0), 1))
        at = len(items) * groups
        roles_of = torch.zeros(len(items), pairs, len(ROLE_NAMES) * len(lexicon.RELATIONS))
        for b, item in enumerate(items):
            for k, target in enumerate(item.roles):
                roles_of[b, k] = target
        return {"rows": torch.tensor([item.row for item in items]),
                "tokens": flat[:at].view(len(items), groups, flat.shape[1]),
                "mask": torch.tensor([[t < len(item.group) for t in range(groups)] for item in items]),
                "pair_tokens": flat[at:].view(len(items), pairs, sides, flat.shape[1]),
                "pair_mask": torch.tensor([[k < len(item.pairs) for k in range(pairs)] for item in items]),
                "roles": roles_of}


def _slot(values: Sequence, k: int):
    """values[k], or None past its end (an item with fewer texts than the batch's widest)."""
    return values[k] if k < len(values) else None


class TextReader(torch.nn.Module):
    """The CLIP's text tower (through its PairEncoder, shared prefixes run once) and a role head on
    its text embedding: the module the text stage's phases train."""

    def __init__(self, pair: PairEncoder, width: int, seed: int):
        super().__init__()
        self.pair = pair
        self.role_head = torch.nn.Linear(width, len(ROLE_NAMES) * len(lexicon.RELATIONS))
        generator = torch.Generator().manual_seed(seed)  # the same head whether or not a run resumed
        with torch.no_grad():
            bound = width ** -0.5
            self.role_head.weight.uniform_(-bound, bound, generator=generator)
            self.role_head.bias.uniform_(-bound, bound, generator=generator)

    def forward(self, tokens: torch.Tensor, tree: PrefixTree) -> tuple[torch.Tensor, torch.Tensor]:
        text = self.pair(None, tokens, tree).text
        return text, self.role_head(text)


@dataclass
class FrozenImages:
    """The train split's image embeddings from the frozen image tower, normalised ([N, d]), with
    their mean (the pairs read the image centred on it), and the frozen temperature."""

    embeddings: torch.Tensor
    logit_scale: torch.Tensor

    @property
    def centred(self) -> torch.Tensor:
        return self.embeddings - self.embeddings.mean(0, keepdim=True)


def text_stage_step(images: FrozenImages, negclip: bool) -> Callable[[torch.nn.Module, dict], tuple]:
    """The loss of one phase: roles alone (pairs of one side), pairs with roles, or, with `negclip`,
    NegCLIP on the captions with the pairs and roles beside it."""
    centred = images.centred

    def step(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        b, k, sides, length = batch["pair_tokens"].shape
        flat = batch["pair_tokens"].view(b * k * sides, length)
        tree = prefix_tree(flat, sides)  # a pair's two sides share their opening: run it once
        groups = batch["tokens"].shape[1] if negclip else 0
        if groups:
            flat_groups = batch["tokens"].view(b * groups, length)
            flat, tree = torch.cat([flat_groups, flat]), prefix_tree(flat_groups, groups).cat(tree)
        text, role_logits = model(flat, tree)
        at = b * groups  # the pairs' rows follow the caption groups'
        # explicit widths: a negclip batch whose images hold no relation has no pair rows (k = 0)
        pair_text = F.normalize(text[at:].float(), dim=-1).view(b, k, sides, text.shape[-1])
        pair_roles = role_logits[at:].view(b, k, sides, role_logits.shape[-1])[:, :, 0]
        loss, parts = pair_terms(pair_text, pair_roles, batch, centred, images.logit_scale)
        if groups:
            group_text = F.normalize(text[:at].float(), dim=-1).view(b, groups, -1)
            own = images.embeddings[batch["rows"].to(images.embeddings.device)]
            term = negclip_loss(gather_with_grad(own), gather_with_grad(group_text), gather_with_grad(batch["mask"]),
                                images.logit_scale)
            loss = loss + term
            parts["negclip"] = term.item()
        return loss, parts

    return step


def pair_terms(pair_text: torch.Tensor, role_logits: torch.Tensor, batch: dict, centred: torch.Tensor,
               logit_scale: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """The role loss on each pair's true statement and, for pairs of two sides ([B, K, 2, d]), the
    pair loss: softplus of the scaled margin of the true statement over its inverse against the
    image, centred. A batch without a pair gives a zero that still reaches the role head (DDP
    expects a gradient for every parameter)."""
    mask = batch["pair_mask"]
    if not mask.any():
        return role_logits.sum() * 0.0, {}
    loss = F.binary_cross_entropy_with_logits(role_logits[mask].float(), batch["roles"][mask])
    parts = {"roles": loss.item()}
    if pair_text.shape[2] == 2:
        image = centred[batch["rows"].to(centred.device)].unsqueeze(1).expand(-1, mask.shape[1], -1)[mask]
        true, false = pair_text[:, :, 0][mask], pair_text[:, :, 1][mask]
        margin = logit_scale.exp() * ((image * true).sum(-1) - (image * false).sum(-1))
        pairs = F.softplus(-margin).mean()
        loss = loss + pairs
        parts.update(pairs=pairs.item(), pair_accuracy=float((margin > 0).float().mean()))
    return loss, parts


@dataclass(kw_only=True)
class TextStagePlan:
    """train_clip's text-stage settings (its `text_*` keys), as the phases read them; built by name,
    since several fields share a type and a swapped pair would still run."""

    roles_epochs: int
    pairs_epochs: int
    negclip_epochs: int
    batch_size: int            # statements per step of the pairs phase
    roles_batch_size: int      # statements per step of the roles phase
    lr: float
    pair_axes: tuple[str, ...]
    long_rate: float
    caption_pool: list[list[str]]  # the train images' captions (negclip phase)
    hard_negatives: int
    negative_kinds: tuple[str, ...]
    attributes: tuple[str, ...] = ()  # attribute facts beside the relations in the pairs and negclip phases
    long_share: float = 0.0  # the share of the negclip phase's images that take one of their long captions
    other_frames: float = 0.0  # the share of relation statements in OTHER_FRAMES
    negclip_batch_size: int | None = None  # images per step of the negclip phase (None: the recipe's batch_size)

    @property
    def epochs(self) -> int:
        return self.roles_epochs + self.pairs_epochs + self.negclip_epochs


def read_relations(run: RecipeRun, model: torch.nn.Module, train: Split, transform: Callable,
                   scenes: dict[int, Scene], tokenizer: ClipTokenizer, plan: TextStagePlan, seed: int) -> dict:
    """The three phases on an open_clip `model` whose image tower and temperature stay as they are;
    returns the last phase's record. The images are embedded once, by the tower as it comes in."""
    model.to(run.device).eval()  # with `epochs: 0` no earlier stage has moved it
    images = FrozenImages(embed_split_images(model.encode_image, train, transform, run.device, run.cfg.workers),
                          model.logit_scale.detach().clone().to(run.device))
    lock(model.visual)
    model.logit_scale.requires_grad_(False)
    reader = TextReader(PairEncoder.of_clip(model), images.embeddings.shape[1], seed)
    facts = relation_facts(train, scenes)
    attributes = attribute_facts(train, scenes, plan.attributes)
    axis_relations = {r for axis in plan.pair_axes for r in AXIS_RELATIONS[axis]}
    phases = (  # (stage, its dataset, negclip)
        (Stage("text_roles", plan.roles_epochs, plan.lr, 0, ROLES_SCHEDULE, plan.roles_batch_size),
         lambda: FactsDataset(facts, seed, plan.long_rate, true_only=True, other_frames=plan.other_frames), False),
        (Stage("text_pairs", plan.pairs_epochs, plan.lr, 0, batch_size=plan.batch_size), lambda: FactsDataset(
            [f for f in facts if f.relation in axis_relations] + attributes, seed, plan.long_rate,
            other_frames=plan.other_frames), False),
        (Stage("text_negclip", plan.negclip_epochs, plan.lr, 0, batch_size=plan.negclip_batch_size),
         lambda: CaptionsDataset(train, plan.caption_pool, scenes, facts + attributes, seed, plan.hard_negatives,
                                 plan.negative_kinds, plan.long_rate, plan.long_share, plan.other_frames), True),
    )
    record: dict = {}
    for stage, dataset, negclip in phases:
        if stage.epochs:
            record = run.fit(reader, dataset(), TextItemBatcher(tokenizer), text_stage_step(images, negclip),
                             stage)["record"]
    return record
