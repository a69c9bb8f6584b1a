"""The text tower's training step on a world batch: shared prefixes run once, against the plain forward;
and the batch's tokenisation, memoised, against open_clip's tokenizer.

A batch is what the world CLIP recipe feeds its text tower: per train image one caption drawn from
its references and long caption, as the recipe draws it, and its world hard negatives. Both forwards run forward and
backward; the embeddings must agree (max |diff|) and the shared one must do the same work faster. The
tokenizers must give the same ids; ours is timed with empty memos ("cold", the first epoch) and after
one pass over the texts ("warm", an epoch that meets its captions again).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from open_clip.tokenizer import SimpleTokenizer

from features.clip_models.factory import clip_text_forward
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.text_batches import prefix_tree, shared_prefix_text_forward
from features.clip_models.tokens import ClipTokenizer
from features.world.negatives import hard_negatives
from features.world.scene import load_world_scenes
from plumbing.errors import DataError
from plumbing.karpathy import load_dataset
from plumbing.timing import comparison, median_seconds
from rewards.recipes.data import long_captions, pick
from rewards.recipes.loop import PairEncoder


def world_texts(world: Path, images: int, negatives: int, seed: int = 0) -> list[str]:
    """Per train image its caption then its negatives ("" where the builder found fewer), as the
    recipe's batcher lays them out."""
    dataset, scenes_path = world / "dataset.json", world / "scenes.json"
    for path in (dataset, scenes_path):
        if not path.is_file():
            raise DataError(f"{path}: not found (--world is a folder made by python -m features.world)")
    entries = [e for e in load_dataset(dataset) if e.split == "train"][:images]
    if not entries:
        raise DataError(f"{dataset}: no train images")
    scenes, _ = load_world_scenes(scenes_path)
    rng = random.Random(seed)
    texts: list[str] = []
    for entry in entries:
        caption = pick(entry.raw_captions + long_captions(entry), rng)
        found = [n.text for n in hard_negatives(caption, scenes[entry.image_id], rng, negatives)]
        texts += [caption, *found, *[""] * (negatives - len(found))]
    return texts


def bench_tokenizer(texts: list[str], context_length: int, repeats: int) -> dict:
    """Our memoised tokenisation of texts, cold and warm, against open_clip's SimpleTokenizer.encode."""
    ours, reference = ClipTokenizer(context_length), SimpleTokenizer(context_length=context_length)
    same = [list(ours.encode(text)) for text in texts] == [reference.encode(text) for text in texts]

    def cold() -> None:
        ours.forget()
        ours.ids(texts)

    cold_s, _ = median_seconds(cold, repeats)
    ours.ids(texts)
    warm_s, _ = median_seconds(lambda: ours.ids(texts), repeats)
    ref_s, _ = median_seconds(lambda: [reference.encode(text) for text in texts], repeats)
    return {"texts": len(texts), "same_ids": same, "cold_s": cold_s, "cold_ratio": ref_s / cold_s,
            **comparison(warm_s, ref_s)}


def bench_text(world: str, arch: str, weights: str | None, repeats: int, images: int = 128,
               negatives: int = 3) -> dict:
    model = load_open_clip(arch, weights).model.train()
    shared = shared_prefix_text_forward(model)
    if shared is None:
        raise DataError(f"{arch}: its text tower is not one the shared-prefix forward knows")
    texts = world_texts(Path(world), images, negatives)
    tokenizer = ClipTokenizer(int(model.context_length))
    ids = iter(tokenizer.ids([text for text in texts if text]))
    tokens = tokenizer.padded([next(ids) if text else [] for text in texts])
    tree = prefix_tree(tokens, 1 + negatives)
    grouped = PairEncoder(model, clip_text_forward(model))  # length-grouped, the previous forward

    def plain(rows: torch.Tensor) -> torch.Tensor:
        return grouped(None, rows)[1]

    def step(forward):
        def run() -> torch.Tensor:
            model.zero_grad(set_to_none=True)
            out = forward()
            out.square().sum().backward()
            return out.detach()
        return run

    with torch.no_grad():
        max_diff = float((plain(tokens) - shared(tokens, tree)).abs().max())
    ours_s, _ = median_seconds(step(lambda: shared(tokens, tree)), repeats)
    ref_s, _ = median_seconds(step(lambda: plain(tokens)), repeats)
    real = int((tokens > 0).sum())
    return {"arch": arch, "texts": len(tokens), "tokens": real, "tokens_run": real - int(tree.shared.sum()),
            **comparison(ours_s, ref_s, max_abs_diff=max_diff),
            "tokenizer": bench_tokenizer(texts, int(model.context_length), repeats)}
