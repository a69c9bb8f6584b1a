"""The starting checkpoint of an SCST run (or sweep), decoded and scored on val exactly as the
run's epochs are: the row every result is compared with. Cached in a JSON file per checkpoint,
with the captions, so reports can show what the start said beside what training made of it."""

from __future__ import annotations

import json
from pathlib import Path

from captioner.inference import decode_for_config, load_captioner, score_captions
from captioner.train_config import TrainConfig
from plumbing.atomic import write_json


def score_start(train: TrainConfig, cache: Path) -> dict:
    """{"checkpoint", every metric of train.eval.metrics, "captions": {image id: caption}}."""
    if cache.exists():
        cached = json.loads(cache.read_text())
        if cached.get("checkpoint") == train.scst.init_from and "captions" in cached:
            return cached
    print(f"scoring the starting checkpoint {train.scst.init_from} on {train.data.val_split}", flush=True)
    model, _, vocab = load_captioner(train.scst.init_from)
    decoded = decode_for_config(model, vocab, train, train.data.val_split, train.eval, train.data.max_val_images,
                                where=f"scst.init_from {train.scst.init_from}")
    captions = {image_id: texts[0] for image_id, texts in decoded.items()}
    scores = score_captions(captions, train, train.eval.metrics).corpus
    start = {"checkpoint": train.scst.init_from, **scores, "captions": {str(i): c for i, c in captions.items()}}
    write_json(cache, start, indent=1)
    return start
