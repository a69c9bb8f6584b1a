"""Specificity triplets and the Specificity Rate (SPECS, papers/specs_paper.txt §3.1–3.2).

A caption split into detail units d_1..d_m gives cumulative captions c_j = d_1 + … + d_j. A positive
triplet (i, c_j, c_j + d_{j+1}) should raise the image–text similarity; a negative one
(i, c_j, c_j + d_-), with d_- a unit of another image, should lower it.

`python -m rewards.specificity` prints SR_pos, SR_neg and their average (each averaged per image,
then over images) for any reward model on a dataset whose images carry detail units. Eq. (2) in
the paper's text reads θ(i, c_j) < θ(i, c_j + d_-); its prose ("adding an irrelevant detail
decreases the similarity") is what we count.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from features.clip_models.factory import RewardModel
from plumbing.errors import DataError
from plumbing.karpathy import ImageEntry
from rewards.clip.scorer import EmbeddingScorer
from rewards.recipes.data import embed_split_images, load_split


@dataclass
class Triplets:
    rows: list[int]  # the image row of each triplet
    base: list[str]
    positive: list[str]
    negative: list[str]


def detail_units_of(entry: ImageEntry) -> list[list[str]]:
    """The detail units of each long caption of one image (the world generator records them)."""
    return [list(c["detail_units"]) for c in entry.extra.get("long_captions", [])
            if isinstance(c, dict) and isinstance(c.get("detail_units"), list) and len(c["detail_units"]) >= 2]


def join_units(units: Sequence[str]) -> str:
    return " ".join(u.strip() for u in units)


def shuffle_tokens(unit: str, rng: random.Random) -> str:
    words = unit.split()
    rng.shuffle(words)
    return " ".join(words)


NegativeFilter = Callable[[str, int], bool]  # (unit, row) -> may this unit be a negative for this row?
MAX_DRAWS = 50


def negative_unit(units: Sequence[Sequence[str]], row: int, rng: random.Random, shuffle_ratio: float,
                  allowed: NegativeFilter | None = None) -> str:
    """A unit from another row's caption that is not one of this row's own units (and passes
    `allowed`, e.g. names an object absent from the image), token-shuffled with probability
    `shuffle_ratio`. Falls back to any other row's unit when no draw passes."""
    if len(units) < 2:
        raise DataError("negative detail units need at least two captions in the batch")
    own = {u.strip().lower() for u in units[row]}
    others = [k for k in range(len(units)) if k != row]
    unit = rng.choice(list(units[rng.choice(others)]))
    for _ in range(MAX_DRAWS):
        if unit.strip().lower() not in own and (allowed is None or allowed(unit, row)):
            break
        unit = rng.choice(list(units[rng.choice(others)]))
    return shuffle_tokens(unit, rng) if rng.random() < shuffle_ratio else unit


def scene_negative_filter(scenes: Mapping[int, object], image_ids: Sequence[int]) -> NegativeFilter:
    """Offline world: a negative must name an object (color and shape) the row's scene lacks, so
    it is false by construction (random units of this world are often true of other images)."""
    from features.world.parse import parse_caption

    def allowed(unit: str, row: int) -> bool:
        scene = scenes[int(image_ids[row])]
        present = {(o.color, o.shape) for o in scene.objects}
        named = [(m.color, m.shape) for m in parse_caption(unit).mentions if m.color]
        return bool(named) and all(n not in present for n in named)

    return allowed


def sample_triplets(units: Sequence[Sequence[str]], rng: random.Random, shuffle_ratio: float = 0.9,
                    allowed: NegativeFilter | None = None) -> Triplets:
    """One positive and one negative triplet per row at a random prefix length (training)."""
    out = Triplets([], [], [], [])
    for row, caption_units in enumerate(units):
        if len(caption_units) < 2:
            raise DataError(f"caption {row} has {len(caption_units)} detail unit(s); triplets need at least 2")
        _add_triplet(out, units, row, rng.randrange(1, len(caption_units)), rng, shuffle_ratio, allowed)
    return out


def all_triplets(units: Sequence[Sequence[str]], seed: int = 0, allowed: NegativeFilter | None = None) -> Triplets:
    """Every prefix of every caption, each with a positive and an unshuffled negative (evaluation)."""
    rng = random.Random(seed)
    out = Triplets([], [], [], [])
    for row, caption_units in enumerate(units):
        for j in range(1, len(caption_units)):
            _add_triplet(out, units, row, j, rng, 0.0, allowed)
    return out


def _add_triplet(out: Triplets, units: Sequence[Sequence[str]], row: int, j: int, rng: random.Random,
                 shuffle_ratio: float, allowed: NegativeFilter | None) -> None:
    """(c_j, c_j + d_{j+1}, c_j + d_-) for `row`, with c_j its first j units."""
    base = join_units(units[row][:j])
    out.rows.append(row)
    out.base.append(base)
    out.positive.append(join_units(units[row][: j + 1]))
    out.negative.append(f"{base} {negative_unit(units, row, rng, shuffle_ratio, allowed)}")


def specificity_rates(image: torch.Tensor, triplets: Triplets, texts: dict[str, torch.Tensor]) -> dict[str, float]:
    """SR_pos, SR_neg and their mean in percent; per image first, then over images."""
    rows = torch.tensor(triplets.rows)
    image = image[rows]

    def theta(captions: list[str]) -> torch.Tensor:
        return (image * torch.stack([texts[c] for c in captions])).sum(-1)

    base = theta(triplets.base)
    up = (theta(triplets.positive) > base).double()
    down = (theta(triplets.negative) < base).double()
    per_image_pos, per_image_neg = [], []
    for row in rows.unique():
        mask = rows == row
        per_image_pos.append(up[mask].mean())
        per_image_neg.append(down[mask].mean())
    sr_pos = 100 * float(torch.stack(per_image_pos).mean())
    sr_neg = 100 * float(torch.stack(per_image_neg).mean())
    return {"sr_pos": sr_pos, "sr_neg": sr_neg, "sr_avg": (sr_pos + sr_neg) / 2, "images": len(per_image_pos),
            "triplets": len(rows)}


@torch.no_grad()
def evaluate_specificity(model: RewardModel, dataset: str, images_root: str, split: str = "val", limit: int = 0,
                         seed: int = 0, workers: int = 2,
                         scenes: str | None = None) -> dict[str, float]:
    data = load_split(dataset, images_root, split, limit)
    units = [detail_units_of(e) for e in data.entries]
    if not any(units):
        raise DataError(f"{dataset}: no image in split {split!r} has long captions with detail units "
                        "('long_captions': [{'raw', 'detail_units'}]); specificity needs them")
    keep = [k for k, u in enumerate(units) if u]
    first_units = [units[k][0] for k in keep]
    allowed = None
    if scenes:
        from features.world.scene import load_scenes

        allowed = scene_negative_filter(load_scenes(scenes), [data.image_ids[k] for k in keep])
    triplets = all_triplets(first_units, seed, allowed)
    scorer = EmbeddingScorer(model, None)
    texts = scorer.text_embeddings([*triplets.base, *triplets.positive, *triplets.negative])
    image = embed_split_images(model.encode_image, data.subset(keep), model.preprocess, model.device, workers)
    return {**specificity_rates(image, triplets, texts), "truncated": scorer.truncated}
