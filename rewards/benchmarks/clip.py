"""The CLIP-family benchmark: our batched scorer against a naive one on an SCST-shaped batch.

Naive = what a first implementation does: open_clip `encode_text` on full-context tokens, one
call per reward term, the images re-encoded in every call, nouns parsed without a cache. Ours
= ClipFamily: image embeddings from an embeds file, one pass over the unique texts of all terms,
micro-batches trimmed to their longest sequence. Both run in this process on the same batch.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from features.clip_models.factory import RewardModelSpec, load_reward_model
from features.store import FeatureWriter
from plumbing.device import pick_device
from plumbing.timing import median_seconds
from rewards.clip.family import ClipFamily
from rewards.clip.formulas import CLIP_S_PREFIX
from rewards.clip.nouns import NounParser

if TYPE_CHECKING:
    from rewards.recipes.distill import DistillConfig

TERMS = ("clip_s", "ref_clip_s", "f_clip_s")


def scst_batch(data: list[dict], images: int, k: int, seed: int) -> tuple[list[int], list[str], list[list[str]]]:
    """B images × K candidate captions drawn from other images' references, 5 references each."""
    rng = random.Random(seed)
    chosen = rng.sample(data, images)
    pool = [r for d in data for r in d["refs"]]
    image_ids, captions, refs = [], [], []
    for item in chosen:
        for caption in rng.sample(pool, k):
            image_ids.append(item["image_id"])
            captions.append(caption)
            refs.append(item["refs"])
    return image_ids, captions, refs


class NaiveScorer:
    def __init__(self, model, context_length: int):
        from open_clip.tokenizer import SimpleTokenizer

        self.model, self.tokenize = model, SimpleTokenizer(context_length=context_length)
        self.device = next(model.parameters()).device

    def _text(self, texts: list[str]) -> torch.Tensor:
        return F.normalize(self.model.encode_text(self.tokenize(texts).to(self.device)), dim=-1)

    def _image(self, pixels: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.model.encode_image(pixels.to(self.device)), dim=-1)

    @torch.no_grad()
    def __call__(self, pixels: torch.Tensor, captions: list[str], refs: list[list[str]],
                 terms: tuple[str, ...] = TERMS) -> dict[str, torch.Tensor]:
        out = {}
        for term in terms:
            out.update(getattr(self, term)(pixels, captions, refs))
        return out

    def clip_s(self, pixels: torch.Tensor, captions: list[str], refs: list[list[str]]) -> dict[str, torch.Tensor]:
        image = self._image(pixels)
        text = self._text([CLIP_S_PREFIX + c for c in captions])
        return {"clip_s": (2.5 * F.cosine_similarity(image, text).clamp(min=0)).cpu()}

    def ref_clip_s(self, pixels: torch.Tensor, captions: list[str], refs: list[list[str]]) -> dict[str, torch.Tensor]:
        image, text = self._image(pixels), self._text([CLIP_S_PREFIX + c for c in captions])
        ref_text = self._text([CLIP_S_PREFIX + r for rs in refs for r in rs])
        ref_clip_s, start = [], 0
        for row, rs in enumerate(refs):
            best = max(float(F.cosine_similarity(text[row:row + 1], ref_text[start:start + len(rs)]).max()), 0.0)
            start += len(rs)
            score = 2.5 * max(float(F.cosine_similarity(image[row:row + 1], text[row:row + 1])), 0.0)
            ref_clip_s.append(0.0 if score + best == 0 else 2 * score * best / (score + best))
        return {"ref_clip_s": torch.tensor(ref_clip_s)}

    def f_clip_s(self, pixels: torch.Tensor, captions: list[str], refs: list[list[str]]) -> dict[str, torch.Tensor]:
        image, sentence = self._image(pixels), self._text(captions)
        nouns = [[t.text for t in doc if t.pos_ == "NOUN"] for doc in NounParser().nlp.pipe(captions)]
        f_clip_s = []
        for row, words in enumerate(nouns):
            total = 2.5 * max(float(F.cosine_similarity(image[row:row + 1], sentence[row:row + 1])), 0.0)
            if words:
                sims = F.cosine_similarity(image[row:row + 1], self._text(words))
                total += float((2.5 * sims.clamp(min=0)).sum())
            f_clip_s.append(total / (len(words) + 1))
        return {"f_clip_s": torch.tensor(f_clip_s)}


def bench_clip(data: list[dict], arch: str, weights: str | None, device: str, repeats: int, images: int = 50,
               k: int = 5, seed: int = 0, terms: tuple[str, ...] = TERMS, precision: str = "fp32") -> dict:
    image_ids, captions, refs = scst_batch(data, images, k, seed)
    with tempfile.TemporaryDirectory() as tmp:
        family, pixels = _our_family(arch, weights, device, image_ids, Path(tmp), seed, terms, precision)
        scorer = family.scorers["clip"]
        rows = torch.tensor([list(dict.fromkeys(image_ids)).index(i) for i in image_ids])

        def ours_cold() -> dict[str, torch.Tensor]:
            family.clear_caches()  # no reference, noun or parse cache from earlier repeats
            return family.scores(captions, image_ids, refs)

        def ours_warm() -> dict[str, torch.Tensor]:
            family.clear_caches(keep_embeddings=True)  # references and nouns seen in an earlier step
            return family.scores(captions, image_ids, refs)

        naive = NaiveScorer(scorer.model.module, scorer.model.context_length)
        naive_s, ref = median_seconds(lambda: naive(pixels[rows], captions, refs, terms), max(1, repeats // 2))
        cold_s, ours = median_seconds(ours_cold, repeats)
        warm_s, _ = median_seconds(ours_warm, repeats)
    diff = max(float((ours[t] - ref[t]).abs().max()) for t in terms)
    return {"arch": arch, "device": str(scorer.device), "precision": str(scorer.autocast_dtype or "fp32"),
            "captions": len(captions), "terms": list(terms),
            "ours_s": round(cold_s, 5), "ours_warm_s": round(warm_s, 5), "naive_s": round(naive_s, 5),
            "ours_texts_per_s": round(len(captions) / cold_s, 1),
            "naive_texts_per_s": round(len(captions) / naive_s, 1),
            "ratio": round(naive_s / cold_s, 2), "ratio_warm": round(naive_s / warm_s, 2), "max_abs_diff": diff}


def _our_family(arch: str, weights: str | None, device: str, image_ids: list[int], tmp: Path, seed: int,
                terms: tuple[str, ...], precision: str):
    """A ClipFamily with all three terms, its embeds file written from random pixels first."""
    spec = RewardModelSpec(kind="open_clip", arch=arch, weights=weights, embeds=str(tmp / "clip.h5"),
                           precision=precision)
    model = load_reward_model(spec, pick_device(device))
    if weights is None:  # random init: save it, so the scorer loads the very same weights by path
        from safetensors.torch import save_file

        spec.weights = str(tmp / "random_init.safetensors")
        save_file({k: v.detach().cpu().contiguous() for k, v in model.module.state_dict().items()}, spec.weights)
    unique = list(dict.fromkeys(image_ids))
    size = model.module.visual.image_size
    side = size[0] if isinstance(size, (tuple, list)) else int(size)
    pixels = torch.randn(len(unique), 3, side, side, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        embeds = F.normalize(model.encode_image(pixels.to(model.device)).float(), dim=-1).cpu().numpy()
    writer = FeatureWriter(spec.embeds, {"image": ((embeds.shape[1],), "float32")},
                           {"fingerprint": model.fingerprint, "model": arch})
    writer.append(unique, {"image": embeds.astype(np.float32)})
    writer.finish()
    writer.close()
    family = ClipFamily({"clip": spec}, device)
    for term in terms:
        family.activate(term)
    return family, pixels


def bench_nouns(data: list[dict]) -> dict:
    texts = list(dict.fromkeys(t for d in data for t in [d["candidate"], *d["refs"]]))
    parser = NounParser()

    def parse() -> list[tuple[str, ...]]:
        parser.clear()
        return parser(texts)

    seconds, nouns = median_seconds(parse, 3)
    count = sum(len(n) for n in nouns)
    return {"captions": len(texts), "nouns": count, "seconds": round(seconds, 3),
            "nouns_per_s": round(count / seconds, 1), "captions_per_s": round(len(texts) / seconds, 1)}


def bench_lclip(teacher_arch: str, teacher_weights: str | None, student_path: str | None, repeats: int,
                batch: int = 128, seed: int = 0, shape: DistillConfig | None = None) -> dict:
    """Parameters and image+text encode throughput of a teacher CLIP and its L-CLIP student (a
    checkpoint, or an untrained one shaped by the DistillConfig `shape`)."""
    from features.clip_models.factory import clip_text_forward
    from features.clip_models.lclip import LClip, load_lclip
    from features.clip_models.open_clip_models import load_open_clip
    from rewards.recipes.distill import DistillConfig, student_config

    torch.manual_seed(seed)
    teacher = load_open_clip(teacher_arch, teacher_weights).model.eval()
    if student_path:
        student = load_lclip(student_path)
    else:
        student = LClip(student_config(teacher, shape or DistillConfig())).eval()
    size = student.config.image_size
    images = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))
    from features.clip_models.tokens import ClipTokenizer

    tokenizer = ClipTokenizer(student.config.context_length)
    texts = [f"a small red circle above {k} big blue squares on a grey background" for k in range(batch)]
    tokens = tokenizer.padded(tokenizer.ids(texts))
    teacher_text = clip_text_forward(teacher)

    def run(encode_image, encode_text):
        with torch.no_grad():
            return encode_image(images), encode_text(tokens)

    teacher_s, _ = median_seconds(lambda: run(teacher.encode_image, teacher_text), repeats)
    student_s, _ = median_seconds(lambda: run(student.encode_image, student.encode_text), repeats)
    teacher_params = sum(p.numel() for p in teacher.parameters())
    student_params = sum(p.numel() for p in student.parameters())
    return {"teacher": teacher_arch, "student": student_path or "an untrained L-CLIP student",
            "batch": batch, "teacher_params": teacher_params, "student_params": student_params,
            "param_ratio": round(student_params / teacher_params, 4),
            "teacher_pairs_per_s": round(batch / teacher_s, 1), "student_pairs_per_s": round(batch / student_s, 1),
            "speedup": round(teacher_s / student_s, 2)}
