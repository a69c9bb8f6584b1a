"""The world-foil check every reward-model recipe ends with: on val images of the offline world,
how often the trained model scores an image's correct caption above a caption with one fact
changed, per foil kind, for short and long captions (chance 0.5, a tie counts one half).

Two tables: the rendered foils (`features.world.foils.world_foils`: added, colour, relation and
shape, in the generator's own sentences) on every val image, and the foils in the references'
wording (`reference_foils`: all ten kinds the hard-negative builder knows, in each image's own first
reference and long caption) on the first REFERENCE_IMAGES val images. A recipe change that trades a
kind nobody looks at for one in the first table (place, count or binding, say) shows in the second.

It scores with the model's own metric formula (clip_s / l_clip_s with the "A photo depicts "
prefix, specs without), from embeddings computed here, so a regression shows in every run.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from features.clip_models.tokens import ClipTokenizer
from features.world.foils import reference_foils, world_foils
from features.world.scene import Scene, load_scenes
from plumbing.errors import DataError
from plumbing.tables import format_table
from rewards.clip import formulas
from rewards.meta.outcomes import grouped_accuracy, win
from rewards.recipes.contrastive import embed_texts
from rewards.recipes.data import Split, embed_split_images

FORMULAS = {"clip_s": (formulas.CLIP_S_PREFIX, formulas.clip_s), "specs": ("", formulas.specs)}
# Enough images that a kind's figure moves by about 0.04 at one standard error, and few enough that the
# long captions' texts (about eleven per image) cost seconds, not the demo's budget.
REFERENCE_IMAGES = 200


@dataclass(frozen=True)
class FoilJudgement:
    row: int  # the item's image, as a row of the split
    kind: str
    captions: str  # "short" or "long"
    win: float  # 1 when the true caption scores higher, 0.5 for a tie, else 0
    text_cosine: float  # between the true caption's and the foil's text embeddings
    # the true caption's text embedding minus the foil's (relation_probe.foil_directions reads them)
    difference: torch.Tensor | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class FoilReport:
    rendered: dict[str, dict[str, float]]  # {"short": {kind: accuracy, ..., "all": ..., "mean": ...}, "long": {...}}
    references: dict[str, dict[str, float]]  # the same for the references' wording
    reference_counts: dict[str, dict[str, int]]  # the foils behind each figure of `references`
    reference_images: int  # how many val images the references' table read


@dataclass(frozen=True)
class SplitFoils:
    rendered: list[dict]  # the rendered foils, one item per image of the split (row order)
    worded: list[dict]  # the foils in the references' wording, on the split's first images
    worded_rows: list[int]  # each worded item's image, as a row of the split
    reference_images: int  # how many images the worded foils read


def build_foils(split: Split, scenes_path: str, seed: int = 0, reference_images: int = REFERENCE_IMAGES) -> SplitFoils:
    """Both foil sets of the split's images (the references' wording on its first `reference_images`):
    built once, then judged with any pair of towers (`judge_split`)."""
    scenes = load_scenes(scenes_path)
    rendered = split_foils(split, scenes, seed, scenes_path)  # first: it names an image without a scene
    rows = list(range(min(reference_images, len(split))))
    captions = {split.image_ids[r]: (split.short[r], split.long[r]) for r in rows}
    worded = reference_foils(scenes, captions, [split.image_ids[r] for r in rows], seed)
    row_of = {image_id: row for row, image_id in enumerate(split.image_ids)}
    return SplitFoils(rendered, worded, [row_of[item["image_id"]] for item in worded], len(rows))


@torch.no_grad()
def judge_split(foils: SplitFoils, images: torch.Tensor, encode_text: Callable, tokenizer: ClipTokenizer,
                formula: str, device: torch.device) -> FoilReport:
    """Both tables, from the split's normalised image embeddings [N, d] (row order) and a text tower."""
    rendered, _ = _accuracy(judge_foils(images, encode_text, tokenizer, foils.rendered, formula, device))
    judged = judge_foils(images[foils.worded_rows], encode_text, tokenizer, foils.worded, formula, device)
    references, counts = _accuracy(judged)
    return FoilReport(rendered, references, counts, foils.reference_images)


@torch.no_grad()
def foil_accuracy(encode_image: Callable, encode_text: Callable, tokenizer: ClipTokenizer, split: Split,
                  transform: Callable, scenes_path: str, formula: str, device: torch.device, workers: int = 0,
                  seed: int = 0, reference_images: int = REFERENCE_IMAGES) -> FoilReport:
    """Both foil tables on the split's images (the references' one on its first `reference_images`)."""
    foils = build_foils(split, scenes_path, seed, reference_images)
    images = embed_split_images(encode_image, split, transform, device, workers)
    return judge_split(foils, images, encode_text, tokenizer, formula, device)


def _accuracy(judged: list[FoilJudgement]) -> tuple[dict, dict]:
    """({label: accuracy per kind with "all" and "mean"}, {label: foils per kind with "all"})."""
    outcomes: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for judgement in judged:
        outcomes[judgement.captions].append((judgement.kind, judgement.win))
    accuracy = {label: grouped_accuracy(pairs) for label, pairs in outcomes.items()}
    counts = {label: dict(sorted(Counter(kind for kind, _ in pairs).items())) | {"all": len(pairs)}
              for label, pairs in outcomes.items()}
    return accuracy, counts


def split_foils(split: Split, scenes: dict[int, Scene], seed: int = 0, scenes_path: str = "scenes.json") -> list[dict]:
    """The world's rendered foils of the split's images, one item per image (row order)."""
    missing = [image_id for image_id in split.image_ids if image_id not in scenes]
    if missing:
        raise DataError(f"{scenes_path}: no scene for image id {missing[0]} ({len(missing)} of {len(split.image_ids)} "
                        "images have none): is it the scenes file of this dataset?")
    return world_foils(scenes, dict(zip(split.image_ids, split.short, strict=True)), split.image_ids, seed)


@torch.no_grad()
def judge_foils(images: torch.Tensor, encode_text: Callable, tokenizer: ClipTokenizer, items: list[dict],
                formula: str, device: torch.device, prefix: str | None = None) -> list[FoilJudgement]:
    """Every foil of every item judged against its true caption, short and long, with the model's
    formula on the images' normalised embeddings [N, d] (row i = item i). An item or foil without
    a field ("long_caption": a kind the builder could change in one wording only) sits that one out.
    `prefix` replaces the formula's own opening (for clip_s "A photo depicts ") on every text."""
    own_prefix, score = FORMULAS[formula]
    prefix = own_prefix if prefix is None else prefix
    judged = []
    for field, label in (("caption", "short"), ("long_caption", "long")):
        rows = [row for row, item in enumerate(items) if field in item]
        foils = [(row, foil) for row in rows for foil in items[row]["foils"] if field in foil]
        if not foils:
            continue
        texts = [prefix + items[row][field] for row in rows] + [prefix + foil[field] for _, foil in foils]
        embedded = embed_texts(encode_text, tokenizer, texts, device)
        right = score(images[rows], embedded[: len(rows)]).tolist()
        wrong = score(images[[row for row, _ in foils]], embedded[len(rows):]).tolist()
        position = {row: k for k, row in enumerate(rows)}
        truth_at = [position[row] for row, _ in foils]  # each foil's true caption among `rows`
        # each foil beside its true caption's embedding: cosines and differences in one pass, one copy off the device
        truths, foil_texts = embedded[truth_at], embedded[len(rows):]
        cosines = (truths * foil_texts).sum(-1).tolist()
        differences = (truths - foil_texts).cpu()
        for (row, foil), k, foil_score, cosine, difference in zip(foils, truth_at, wrong, cosines, differences,
                                                                  strict=True):
            judged.append(FoilJudgement(row, foil["kind"], label, win(right[k], foil_score), cosine, difference))
    return judged


def announce(name: str, report: FoilReport) -> dict:
    """Print both tables under `name` and return the entries a recipe's summary JSON keeps."""
    print(foil_table(name, report))
    return {"world_foils": report.rendered, "reference_foils": report.references,
            "reference_foil_counts": report.reference_counts}


def foil_table(name: str, report: FoilReport) -> str:
    """Both tables, as a run prints them at its end; the second with the number of foils behind each
    figure (a short reference states some facts only now and then)."""
    return (f"world-foil accuracy of {name} (val; chance 0.5):\n" + _table(report.rendered) +
            f"\nin the references' wording (first {report.reference_images} val images; one foil per kind and "
            "caption; n: foils):\n" + _table(report.references, report.reference_counts))


def _table(accuracy: dict[str, dict[str, float]], counts: dict[str, dict[str, int]] | None = None) -> str:
    kinds = sorted({k for by_kind in accuracy.values() for k in by_kind}, key=lambda k: (k in ("all", "mean"), k))
    rows = [[label, *(f"{by_kind.get(k, float('nan')):.3f}" for k in kinds)] for label, by_kind in accuracy.items()]
    for label, by_kind in (counts or {}).items():
        rows.append([f"n {label}", *(str(by_kind[k]) if k in by_kind else "" for k in kinds)])
    return format_table(["captions", *kinds], rows)
