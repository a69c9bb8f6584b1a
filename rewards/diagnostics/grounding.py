"""Grounding on the offline world: what captions claim, checked against scenes.json (object
recall, hallucination per mention and per caption, attribute errors)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from features.world.parse import attribute_errors, match_object, parse_caption
from features.world.scene import Scene
from plumbing.errors import DataError


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
