"""Where a CLIP on the offline world loses spatial relations: in its image embedding, or in its
text tower's reading of the relation words.

Three measurements, each split by axis (horizontal: left of / right of; vertical: above / below):

- the rendered relation foils (rewards.recipes.foil_report), with the cosine between the true
  caption's and the foil's text embeddings: near 1, the text tower hardly tells the two relation
  words apart, whatever the image;
- a linear readout of where each object is from the image embedding alone: ridge regression from
  the embedding to the centre of every shape (colour) that is unique in its scene, fitted on one
  split and read on another, with how often it orders two such objects as the scene does (for
  pairs whose relation holds on that axis). High order accuracy with foils at chance puts the loss
  in the text tower;
- the best a text tower could do with this image embedding (`read_relations`): a relation foil
  differs from its caption only in the relation, so the image ranks them by the image embedding's
  dot product with the difference of their two text embeddings. Give that difference the simplest
  form a text tower can compose, one vector per colour and per shape named, subject minus object
  ("A above B" = u_A - u_B), fit the vectors by ridge on one split's object pairs and read another's.
  Its accuracy is a ceiling to hold the relation foils against: with the vectors fitted, the image
  embedding alone orders the pairs.

`foil_directions` says why a relation can be there and still be read last: the share of each foil
kind's text difference (the true caption's embedding minus the foil's) that lies in the top principal
directions of the images' embeddings, beside the share of the images' variance there. A kind whose
difference lies where the images hardly vary is one a loss in the raw embedding space (a student's L_D,
say) fits last.

Beside them, `read_facts` reads a scene's other facts the same way (a ridge readout onto each value,
the largest wins): the background, the object count, and a one-object scene's size and texture. A
fact the embedding has lost cannot be read from any caption either.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import torch
import torch.nn.functional as F

from features.world import lexicon
from features.world.captions import reading_order
from features.world.foils import stated_relations
from features.world.scene import RELATION_MARGIN, Scene, dominant_relation
from rewards.recipes.contrastive import embedding_spectrum
from rewards.recipes.foil_report import FoilJudgement
from rewards.recipes.mirror import AXES  # ("horizontal", "vertical")

AXIS_OF = {"left of": "horizontal", "right of": "horizontal", "above": "vertical", "below": "vertical"}
# name: (the objects' attribute, its values)
GROUPS = {"shape": ("shape", tuple(lexicon.SHAPES)), "colour": ("color", tuple(lexicon.COLORS))}
RIDGE = 1e-2
SPECTRUM_TOPS = (8, 16, 32, 64)  # the leading principal directions `foil_directions` reports
RELATION_RIDGE = 1.0  # penalty of `read_relations`' vectors (val accuracy is flat from 0.1 to 1 on the world)
FIRST_OF_AXIS = {"horizontal": "left of", "vertical": "above"}  # the relation coded +1 on each axis
NAME_SLOT = {name: k for k, name in enumerate([*lexicon.COLORS, *lexicon.SHAPES])}  # a vector of read_relations each
# name: (the fact of a scene, None where the readout skips it; its values, None: those the scenes have)
FACTS = {
    "background": (lambda scene: scene.background, tuple(lexicon.BACKGROUNDS)),
    "count": (lambda scene: len(scene.objects), None),
    "size (one object)": (lambda scene: scene.objects[0].size if len(scene.objects) == 1 else None,
                          tuple(lexicon.SIZES)),
    "texture (one object)": (lambda scene: scene.objects[0].texture if len(scene.objects) == 1 else None,
                             lexicon.TEXTURES),
}


def stated_axes(scene: Scene) -> dict[str, str | None]:
    """The axis of the relations a rendered caption states: the short caption's one relation, and
    the long caption's (None with one object; "mixed" where the long caption states both)."""
    first, relations = stated_relations(reading_order(scene))
    if first is None:
        return {"short": None, "long": None}
    long_axes = {AXIS_OF[relation] for relation in relations if relation is not None}
    return {"short": AXIS_OF[first], "long": long_axes.pop() if len(long_axes) == 1 else "mixed"}


def relation_foils_by_axis(judged: list[FoilJudgement], scenes: list[Scene]) -> list[dict]:
    """Rows {captions, axis, foils, accuracy, text_cosine} for the relation foils (scenes[row] is
    the scene of judgement.row)."""
    relation_rows = {j.row for j in judged if j.kind == "relation"}
    axes = {row: stated_axes(scenes[row]) for row in relation_rows}
    groups: dict[tuple[str, str], list[FoilJudgement]] = defaultdict(list)
    for j in judged:
        if j.kind == "relation":
            groups[(j.captions, axes[j.row][j.captions])].append(j)
    return [{"captions": captions, "axis": axis, "foils": len(rows),
             "accuracy": sum(j.win for j in rows) / len(rows),
             "text_cosine": sum(j.text_cosine for j in rows) / len(rows)}
            for (captions, axis), rows in sorted(groups.items())]


def foil_directions(images: torch.Tensor, judged: list[FoilJudgement], tops: tuple[int, ...] = SPECTRUM_TOPS
                    ) -> list[dict]:
    """The images' variance share in their embeddings' top-k principal directions (`images` [N, d]), then per
    captions and foil kind the share of its foils' text differences' energy there (the judgements'
    `difference`, summed over the kind's foils)."""
    values, vectors = embedding_spectrum(images)
    values, vectors = values.flip(0), vectors.flip(1)
    tops = tuple(k for k in tops if k <= len(values))
    rows = [{"captions": "images", "kind": "variance", "foils": len(images),
             "shares": {k: float(values[:k].sum() / values.sum()) for k in tops}}]
    grouped: dict[tuple[str, str], list[torch.Tensor]] = defaultdict(list)
    for judgement in judged:
        if judgement.difference is not None:
            grouped[(judgement.captions, judgement.kind)].append(judgement.difference)
    for (captions, kind), differences in sorted(grouped.items()):
        energy = (torch.stack(differences).double() @ vectors).pow(2).sum(0)
        rows.append({"captions": captions, "kind": kind, "foils": len(differences),
                     "shares": {k: float(energy[:k].sum() / energy.sum()) for k in tops}})
    return rows


def centre_targets(scenes: list[Scene]) -> dict[str, torch.Tensor]:
    """{group: [N, names, 2]} each unique shape's (colour's) centre over the image side, NaN where
    the scene has none or several."""
    out = {}
    for group, (attribute, names) in GROUPS.items():
        target = torch.full((len(scenes), len(names), 2), float("nan"))
        for row, scene in enumerate(scenes):
            values = [getattr(o, attribute) for o in scene.objects]
            for obj, value in zip(scene.objects, values, strict=True):
                if values.count(value) == 1:
                    target[row, names.index(value)] = torch.tensor(obj.center) / scene.image_size
        out[group] = target
    return out


def fit_readout(embeddings: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Ridge weights [d + 1, K, 2] from embeddings [N, d] to each name's centre in targets [N, K, 2],
    each fitted on the rows where that name is known (not NaN); a name known on fewer than two rows
    reads as 0."""
    design = _with_bias(embeddings)
    weights = torch.zeros(design.shape[1], *targets.shape[1:], dtype=torch.float64)
    for k in range(targets.shape[1]):
        known = ~targets[:, k, 0].isnan()
        if known.sum() >= 2:
            weights[:, k] = _ridge(design[known], targets[known, k].double())
    return weights


def read_positions(fit_embeddings: torch.Tensor, fit_scenes: list[Scene], embeddings: torch.Tensor,
                   scenes: list[Scene]) -> list[dict]:
    """Rows {axis, r2, order_by_shape, order_by_colour, pairs_by_shape, pairs_by_colour}: the readout
    fitted on (fit_embeddings, fit_scenes), measured on (embeddings, scenes)."""
    fit_targets, targets = centre_targets(fit_scenes), centre_targets(scenes)
    design = _with_bias(embeddings)
    predicted = {group: torch.einsum("nd,dkc->nkc", design, fit_readout(fit_embeddings, fit_targets[group]))
                 for group in GROUPS}
    rows = []
    for a, axis in enumerate(AXES):
        row: dict = {"axis": axis}
        truth_all, predicted_all = [], []
        for group in GROUPS:
            truth, guess = targets[group][:, :, a].double(), predicted[group][:, :, a]
            truth_all.append(truth[~truth.isnan()])
            predicted_all.append(guess[~truth.isnan()])
            wins = _ordered_pairs(truth, guess)
            row[f"order_by_{group}"] = sum(wins) / len(wins) if wins else float("nan")
            row[f"pairs_by_{group}"] = len(wins)
        truth, guess = torch.cat(truth_all), torch.cat(predicted_all)
        row["r2"] = float(1 - ((guess - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum())
        rows.append(row)
    return rows


def read_facts(fit_embeddings: torch.Tensor, fit_scenes: list[Scene], embeddings: torch.Tensor,
               scenes: list[Scene]) -> list[dict]:
    """Rows {fact, images, accuracy, majority}: each fact of FACTS read from the embedding by a ridge
    readout onto its values (one-hot) fitted on (fit_embeddings, fit_scenes), measured on the
    scenes that have the fact; `majority` is the share of its most common value there."""
    rows = []
    for fact, (value_of, values) in FACTS.items():
        fit_values, measured_values = ([value_of(scene) for scene in group] for group in (fit_scenes, scenes))
        fit_rows, measured_rows = ([k for k, value in enumerate(group) if value is not None]
                                   for group in (fit_values, measured_values))
        if len(fit_rows) < 2 or not measured_rows:
            continue
        values = values or tuple(sorted({*fit_values, *measured_values} - {None}))
        fit_index, truth = (torch.tensor([values.index(group[k]) for k in known]) for group, known in
                            ((fit_values, fit_rows), (measured_values, measured_rows)))
        weights = _ridge(_with_bias(fit_embeddings[fit_rows]), F.one_hot(fit_index, len(values)).double())
        guess = (_with_bias(embeddings[measured_rows]) @ weights).argmax(1)
        rows.append({"fact": fact, "images": len(measured_rows),
                     "accuracy": float((guess == truth).double().mean()),
                     "majority": float(truth.bincount(minlength=len(values)).max()) / len(measured_rows)})
    return rows


def read_relations(fit_embeddings: torch.Tensor, fit_scenes: list[Scene], embeddings: torch.Tensor,
                   scenes: list[Scene]) -> list[dict]:
    """Rows {axis, pairs, fit_pairs, fit_accuracy, accuracy}: for every two objects of a scene whose
    captions would state a relation on that axis (`dominant_relation`), whether e · (u_a - u_b) has
    the relation's sign, where u_x = colour vector + shape vector of object x, fitted by ridge on
    (fit_embeddings, fit_scenes) and measured on (embeddings, scenes)."""
    fitted, measured = _relation_designs(fit_embeddings, fit_scenes), _relation_designs(embeddings, scenes)
    rows = []
    for axis in AXES:
        if axis not in fitted or axis not in measured:
            continue
        (fit_design, fit_signs), (design, signs) = fitted[axis], measured[axis]
        vectors = _ridge(fit_design, fit_signs, RELATION_RIDGE)
        rows.append({"axis": axis, "pairs": len(signs), "fit_pairs": len(fit_signs),
                     "fit_accuracy": _sign_accuracy(fit_design @ vectors, fit_signs),
                     "accuracy": _sign_accuracy(design @ vectors, signs)})
    return rows


def _relation_designs(embeddings: torch.Tensor, scenes: list[Scene]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{axis: ([pairs, names * d], [pairs])} for the axes that have pairs: each pair's (subject -
    object) name code times its image's embedding, and +1 / -1 for the axis's first / second relation."""
    codes, rows, signs = defaultdict(list), defaultdict(list), defaultdict(list)
    for row, scene in enumerate(scenes):
        for a, b in itertools.combinations(scene.objects, 2):
            relation = dominant_relation(a, b)
            axis = AXIS_OF[relation]
            code = torch.zeros(len(NAME_SLOT), dtype=torch.float64)
            for obj, sign in ((a, 1.0), (b, -1.0)):
                code[NAME_SLOT[obj.color]] += sign
                code[NAME_SLOT[obj.shape]] += sign
            codes[axis].append(code)
            rows[axis].append(row)
            signs[axis].append(1.0 if relation == FIRST_OF_AXIS[axis] else -1.0)
    return {axis: (torch.einsum("pk,pd->pkd", torch.stack(codes[axis]), embeddings[rows[axis]].double()).flatten(1),
                   torch.tensor(signs[axis], dtype=torch.float64))
            for axis in codes}


def _sign_accuracy(scores: torch.Tensor, signs: torch.Tensor) -> float:
    return float((scores * signs > 0).double().mean())


def _ridge(design: torch.Tensor, targets: torch.Tensor, penalty: float = RIDGE) -> torch.Tensor:
    ridge = penalty * torch.eye(design.shape[1], dtype=torch.float64)
    return torch.linalg.solve(design.T @ design + ridge, design.T @ targets)


def _with_bias(embeddings: torch.Tensor) -> torch.Tensor:
    return torch.cat([embeddings.double(), torch.ones(len(embeddings), 1, dtype=torch.float64)], dim=1)


def _ordered_pairs(truth: torch.Tensor, predicted: torch.Tensor) -> list[float]:
    """For every two known objects of a row whose centres differ by more than the world's relation
    margin: 1 when the readout orders them as the scene does."""
    wins = []
    for row in range(len(truth)):
        known = (~truth[row].isnan()).nonzero().flatten().tolist()
        for i, j in itertools.combinations(known, 2):
            gap = truth[row, i] - truth[row, j]
            if abs(gap) > RELATION_MARGIN:
                wins.append(float((predicted[row, i] - predicted[row, j]) * gap > 0))
    return wins
