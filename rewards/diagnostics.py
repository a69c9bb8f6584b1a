"""Caption diagnostics: length, vocabulary, diversity, repetition, bad endings; and, on the
offline world, grounding against scenes.json (object recall, hallucination, attribute errors)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from captioner.errors import DataError
from captioner.world.parse import attribute_errors, match_object, parse_caption
from captioner.world.scene import Scene

# A caption that ends in one of these was cut off or rambled ("a dog on a").
FUNCTION_WORDS = frozenset(
    ["a", "an", "the", "of", "and", "or", "with", "on", "in", "at", "to", "from", "by", "for", "near", "next", "is", "are", "was", "were", "its", "their", "his", "her", "this", "that", "some", "other", "while", "as", "into", "onto", "over", "under"]
)


def _ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def text_diagnostics(tokenized: Sequence[str]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Corpus values and per-caption values of the text-only diagnostics."""
    captions = [c.split() for c in tokenized]
    lengths = [len(c) for c in captions]
    repeat = [(len(b) - len(set(b))) / len(b) if (b := _ngrams(c, 2)) else 0.0 for c in captions]
    bad_end = [float(bool(c) and c[-1] in FUNCTION_WORDS) for c in captions]
    corpus = {
        "mean_length": float(np.mean(lengths)) if lengths else 0.0,
        "vocab_used": float(len({w for c in captions for w in c})),
        "distinct_1": _distinct(captions, 1),
        "distinct_2": _distinct(captions, 2),
        "repeat_2": float(np.mean(repeat)) if repeat else 0.0,
        "bad_ending": float(np.mean(bad_end)) if bad_end else 0.0,
    }
    per_item = {"mean_length": [float(n) for n in lengths], "repeat_2": repeat, "bad_ending": bad_end}
    return corpus, per_item


def _distinct(captions: list[list[str]], n: int) -> float:
    grams = [g for c in captions for g in _ngrams(c, n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def load_scenes(path: str | Path) -> dict[int, Scene]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {int(k): Scene.from_json(v) for k, v in data["images"].items()}
    except FileNotFoundError:
        raise DataError(f"{path}: scenes file not found") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: not a world scenes.json: {exc}") from None


def grounding(image_ids: Sequence[int], captions: Sequence[str],
              scenes: dict[int, Scene]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Object recall (colour and shape right), hallucination per mention and per caption, and the
    attribute error rate (size/texture words that contradict the named object)."""
    recall, halluc_caption, mention_total, mention_bad, attr_total, attr_bad = [], [], 0, 0, 0, 0
    per_halluc = []
    for image_id, caption in zip(image_ids, captions, strict=True):
        scene = scenes.get(int(image_id))
        if scene is None:
            raise DataError(f"image id {image_id} is not in scenes.json")
        found, bad = set(), 0
        mentions = parse_caption(caption).mentions
        for mention in mentions:
            obj = match_object(mention, scene)
            if obj is None or mention.color is None:
                bad += obj is None
                continue
            found.add(obj.id)
            attr_total += 1
            attr_bad += bool(attribute_errors(mention, obj))
        mention_total += len(mentions)
        mention_bad += bad
        recall.append(len(found) / len(scene.objects))
        halluc_caption.append(float(bad > 0))
        per_halluc.append(bad / len(mentions) if mentions else 0.0)
    corpus = {
        "object_recall": float(np.mean(recall)) if recall else 0.0,
        "hallucination_mention": mention_bad / mention_total if mention_total else 0.0,
        "hallucination_caption": float(np.mean(halluc_caption)) if halluc_caption else 0.0,
        "attribute_error": attr_bad / attr_total if attr_total else 0.0,
    }
    per_item = {"object_recall": recall, "hallucination_mention": per_halluc, "hallucination_caption": halluc_caption}
    return corpus, per_item
