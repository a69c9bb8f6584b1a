"""CLIP-family scores: each equals its paper's formula computed directly; terms are independent of
each other; edge captions have defined values; bank and suite share one model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from open_clip.tokenizer import SimpleTokenizer
from PIL import Image

from features.clip_models.factory import load_reward_model
from features.clip_models.spec import RewardModelSpec
from plumbing.errors import ConfigError, DataError
from rewards import MetricSuite, RewardBank, ScoringContext
from rewards.clip.family import ClipFamily
from rewards.clip.nouns import load_spacy
from tests.clip_fixtures import (
    TINY_ARCH,
    save_lclip,
    save_longclip,
    save_open_clip,
    write_embeds,
)

ALL_TERMS = ["clip_s", "ref_clip_s", "f_clip_s", "l_clip_s", "ref_l_clip_s", "specs"]


@pytest.fixture(scope="module")
def models(tiny_world, tmp_path_factory) -> dict[str, RewardModelSpec]:
    root = tmp_path_factory.mktemp("clip_models")
    clip = save_open_clip(root / "clip.safetensors")
    longclip = save_longclip(root / "spec.pt")
    lclip, _ = save_lclip(root / "lclip.ckpt")
    return {
        "clip": RewardModelSpec(arch=TINY_ARCH, weights=str(clip),
                                embeds=str(write_embeds(tiny_world, f"open_clip:{TINY_ARCH}", clip, root / "clip.h5"))),
        "specs": RewardModelSpec(kind="longclip", weights=str(longclip),
                                 embeds=str(write_embeds(tiny_world, "longclip", longclip, root / "specs.h5"))),
        "lclip": RewardModelSpec(kind="lclip", weights=str(lclip),  # heads: width // 64, as in L-CLIP
                                 embeds=str(write_embeds(tiny_world, "lclip", lclip, root / "lclip.h5"))),
    }


@pytest.fixture(scope="module")
def batch(tiny_world) -> tuple[list[int], list[str], list[list[str]], list[Path]]:
    images = json.loads((tiny_world / "dataset.json").read_text())["images"][:6]
    ids, captions, refs, paths = [], [], [], []
    for k, image in enumerate(images):
        sentences = [s["raw"] for s in image["sentences"]]
        for caption in (sentences[0], images[(k + 1) % 6]["sentences"][1]["raw"]):  # one right, one wrong
            ids.append(image["imgid"])
            captions.append(caption)
            refs.append(sentences[1:])
            paths.append(tiny_world / image["filepath"] / image["filename"])
    return ids, captions, refs, paths


def _direct_embeddings(spec: RewardModelSpec, paths: list[Path], texts: list[str]):
    model = load_reward_model(spec)
    with torch.no_grad():
        pixels = torch.stack([model.preprocess(Image.open(p).convert("RGB")) for p in paths])
        image = F.normalize(model.module.encode_image(pixels), dim=-1)
        tokens = SimpleTokenizer(context_length=model.context_length)(texts)
        text = F.normalize(model.module.encode_text(tokens), dim=-1)
    return image, dict(zip(texts, text, strict=True))


def _hm(a: float, b: float) -> float:
    return 0.0 if a + b == 0 else 2 * a * b / (a + b)


def test_each_score_equals_its_formula(models, batch):
    ids, captions, refs, paths = batch
    family = ClipFamily(models, "cpu")
    for term in ALL_TERMS:
        family.activate(term)
    got = family.scores(captions, ids, refs)
    nlp = load_spacy()
    nouns = [[t.text for t in nlp(c) if t.pos_ == "NOUN"] for c in captions]
    prefix = "A photo depicts "
    clip_texts = [prefix + c for c in captions] + [prefix + r for rs in refs for r in rs] + captions + \
        [n for ns in nouns for n in ns]
    for key, sim_terms in (("clip", ("clip_s", "ref_clip_s", "f_clip_s")), ("lclip", ("l_clip_s", "ref_l_clip_s"))):
        image, text = _direct_embeddings(models[key], paths, clip_texts)
        for i, caption in enumerate(captions):
            cos = float(image[i] @ text[prefix + caption])
            clip_s = 2.5 * max(cos, 0.0)
            best_ref = max(float(text[prefix + caption] @ text[prefix + r]) for r in refs[i])
            ref_clip_s = _hm(clip_s, max(best_ref, 0.0))
            assert float(got[sim_terms[0]][i]) == pytest.approx(clip_s, abs=1e-5)
            assert float(got[sim_terms[1]][i]) == pytest.approx(ref_clip_s, abs=1e-5)
            if key == "clip":
                parts = [2.5 * max(float(image[i] @ text[t]), 0.0) for t in [caption, *nouns[i]]]
                assert float(got["f_clip_s"][i]) == pytest.approx(sum(parts) / len(parts), abs=1e-5)
    image, text = _direct_embeddings(models["specs"], paths, captions)
    for i, caption in enumerate(captions):
        assert float(got["specs"][i]) == pytest.approx(max((float(image[i] @ text[caption]) + 1) / 2, 0.0), abs=1e-5)
    assert any(v > 0 for v in got["clip_s"].tolist())  # not all clamped to zero


def test_a_term_alone_equals_the_term_among_others(models, batch):
    ids, captions, refs, _ = batch
    together = ClipFamily(models, "cpu")
    for term in ALL_TERMS:
        together.activate(term)
    mixed = together.scores(captions, ids, refs)
    for term in ALL_TERMS:
        alone = ClipFamily(models, "cpu")
        alone.activate(term)
        assert torch.allclose(alone.scores(captions, ids, refs)[term], mixed[term], rtol=0, atol=0), term


def test_edge_captions_have_defined_values(models, batch):
    ids, _, refs, _ = batch
    family = ClipFamily(models, "cpu")
    for term in ALL_TERMS:
        family.activate(term)
    captions = ["", "word " * 1000, "it is over there and then it went away", "a red circle"]
    got = family.scores(captions, ids[:4], refs[:4])
    for term, values in got.items():
        assert values.shape == (4,) and torch.isfinite(values).all(), term
    scorer = family.scorers["clip"]
    assert scorer.truncated >= 1 and family.scorers["specs"].truncated >= 1  # the 1,000-word caption, logged
    # no nouns: f_clip_s is its sentence term, 2.5·max(cos(I, C), 0) without prefix
    image = scorer.image_embeddings(ids[2:3])[0]
    sentence = scorer.text_embeddings([captions[2]])[captions[2]]
    assert float(got["f_clip_s"][2]) == pytest.approx(2.5 * max(float(image @ sentence), 0.0), abs=1e-6)


def test_unique_texts_and_cached_references(models, batch):
    ids, captions, refs, _ = batch
    family = ClipFamily({"clip": models["clip"]}, "cpu")
    family.activate("clip_s")
    family.activate("ref_clip_s")
    scorer = family.scorers["clip"]
    repeated = captions[:2] * 5  # K samples that collapse to two strings
    family.scores(repeated, ids[:2] * 5, refs[:2] * 5)
    first = scorer.texts_encoded
    assert first == 2 + len({r for rs in refs[:2] for r in rs})
    family.scores(captions[2:4], ids[:2], refs[:2])  # same references: served from the cache
    assert scorer.texts_encoded == first + 2


def test_bad_inputs(models, tmp_path, batch):
    other = RewardModelSpec(arch=TINY_ARCH, weights=str(save_open_clip(tmp_path / "other.safetensors", seed=5)),
                            embeds=models["clip"].embeds)
    with pytest.raises(DataError, match="fingerprint"):
        ClipFamily({"clip": other}, "cpu").activate("clip_s")
    with pytest.raises(ConfigError, match=r"reward_models\.specs"):
        ClipFamily({"clip": models["clip"]}, "cpu").activate("specs")
    family = ClipFamily({"clip": models["clip"]}, "cpu")
    family.activate("clip_s")
    with pytest.raises(DataError, match="image id 987654"):
        family.scores(["a red circle"], [987654])


def test_bank_and_suite_share_one_family(models, batch):
    ids, captions, refs, _ = batch
    references = {i: r for i, r in zip(ids, refs, strict=True)}
    context = ScoringContext(references=references, reward_models=models, device="cpu")
    bank = RewardBank.from_config({"clip_s": 0.5, "ref_clip_s": 0.5}, context)
    out = bank(captions, ids)
    assert set(out.values) == {"clip_s", "ref_clip_s"}
    assert torch.allclose(out.total, 0.5 * out.values["clip_s"] + 0.5 * out.values["ref_clip_s"], atol=1e-6)
    with MetricSuite(["clip_s", "specs", "bleu_4"], context) as suite:
        result = suite.score(dict(zip(ids[::2], captions[::2], strict=True)), references)
    assert bank.rewards["clip_s"].family is context.clip_family
    assert set(context.clip_family.scorers) == {"clip", "specs"}
    assert set(result.corpus) == {"clip_s", "specs", "bleu_4"}
    with MetricSuite("all", ScoringContext()) as suite:
        assert "no reward_models.clip configured" in suite.skipped["clip_s"]
