"""The reward models users download, at their real sizes and in their real file layouts, with random
weights made here: open_clip ViT-B-32 (state dict as .safetensors and as a torch file), SPECS's LongCLIP-B
spec.pt (OpenAI key names, both position tables, 248 positions) and the L-CLIP paper's student (a
DistillCLIP Lightning checkpoint). Each loads by path through `rewards.score` as a user runs it, on
images at COCO-like sizes, and its score equals a direct computation written here."""

from __future__ import annotations

import json

import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file

from features.clip_models.lclip import LClip, LClipConfig
from features.clip_models.longclip import KEEP_POSITIONS, LONG_CONTEXT
from features.coco_rehearsal import sample_captions
from rewards import score as score_cli

CAPTIONS = ["a man riding a wave on top of a surfboard", "two dogs play with a red frisbee on the grass",
            "a plate of food with broccoli and rice", "a red double decker bus driving down a street"]
PREFIX = "A photo depicts "


@pytest.fixture(scope="module")
def coco_like(coco_stand_in, tmp_path_factory):
    """Four of the stand-in's JPEGs (COCO's sizes and names) and predictions that find them by id."""
    root = tmp_path_factory.mktemp("coco_like")
    dataset = json.loads(coco_stand_in.dataset.read_text())["images"][: len(CAPTIONS)]
    for k, image in enumerate(dataset, start=1):
        (root / f"COCO_val2014_{k:012d}.jpg").write_bytes(
            (coco_stand_in.images / image["filepath"] / image["filename"]).read_bytes())
    (root / "results.json").write_text(json.dumps([{"image_id": k + 1, "caption": c} for k, c in enumerate(CAPTIONS)]))
    return root


def _scores(folder, tmp_path, metric: str, model_flag: str, predictions=None) -> dict[int, float]:
    per_item = tmp_path / "per_item.json"
    assert score_cli.main(["--predictions", str(predictions or folder / "results.json"), "--images", str(folder),
                           "--reward-model", model_flag, "--metrics", metric, "--embeds-cache", str(tmp_path / "cache"),
                           "--save-per-instance", str(per_item), "--device", "cpu"]) == 0
    return {int(i): v[metric] for i, v in json.loads(per_item.read_text()).items()}


def _images(folder, preprocess) -> torch.Tensor:
    return torch.stack([preprocess(Image.open(folder / f"COCO_val2014_{k:012d}.jpg").convert("RGB"))
                        for k in range(1, len(CAPTIONS) + 1)])


def _assert_scores(got: dict[int, float], expected: torch.Tensor) -> None:
    assert sorted(got) == list(range(1, len(CAPTIONS) + 1))
    for k, value in enumerate(expected.tolist(), start=1):
        assert got[k] == pytest.approx(value, abs=1e-4)


@pytest.fixture(scope="module")
def vit_b_32(coco_stand_in):
    """open_clip's ViT-B-32 with the stand-in's random weights, built here and loaded by open_clip itself."""
    model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32")
    model.load_state_dict(load_file(str(coco_stand_in.weights("vit_b_32.safetensors"))))
    return model.eval(), preprocess


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_open_clip_vit_b_32_at_real_size_scores_as_open_clip_does(coco_like, coco_stand_in, vit_b_32, tmp_path,
                                                                  suffix):
    model, preprocess = vit_b_32
    weights = coco_stand_in.weights("vit_b_32.safetensors")
    assert sum(v.numel() for k, v in model.state_dict().items() if k != "logit_scale") > 150_000_000
    if suffix == ".pt":  # the same state dict as a torch file
        weights = tmp_path / "vit_b_32.pt"
        torch.save(model.state_dict(), weights)
    # each image gets the caption of a pool of real ones that it matches best, so that CLIP-S's clamp at 0
    # hides no difference (random weights put most cosines near 0)
    pool = [c for entry in sample_captions(20) for c in entry["captions"]]
    with torch.no_grad():
        images = F.normalize(model.encode_image(_images(coco_like, preprocess)), dim=-1)
        texts = F.normalize(model.encode_text(open_clip.get_tokenizer("ViT-B-32")([PREFIX + c for c in pool])), dim=-1)
    best = (images @ texts.T).argmax(dim=1)
    predictions = tmp_path / "best_captions.json"
    predictions.write_text(json.dumps([{"image_id": k + 1, "caption": pool[j]} for k, j in enumerate(best.tolist())]))
    got = _scores(coco_like, tmp_path, "clip_s", f"clip=open_clip:ViT-B-32:{weights}", predictions)
    cosine = (images * texts[best]).sum(-1)
    _assert_scores(got, 2.5 * cosine.clamp(min=0))
    assert (cosine > 0).sum() >= 2  # not a comparison of zeros


def test_a_specs_longclip_b_checkpoint_scores_as_its_248_position_text_tower(coco_like, coco_stand_in, tmp_path):
    spec = coco_stand_in.weights("spec.pt")
    state = torch.load(spec, weights_only=True)
    assert state["positional_embedding"].shape == state["positional_embedding_res"].shape == (LONG_CONTEXT, 512)
    got = _scores(coco_like, tmp_path, "specs", f"specs=longclip:{spec}")
    # OpenAI's CLIP, which LongCLIP and SPECS start from, runs QuickGELU
    model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32-quickgelu")
    loaded = model.load_state_dict({k: v for k, v in state.items() if not k.startswith("positional_embedding")},
                                   strict=False)
    assert loaded.missing_keys == ["positional_embedding"] and not loaded.unexpected_keys
    model.eval()

    # directly: ViT-B-32's text tower with LongCLIP's effective table and a 248-long causal mask, no prefix
    table = torch.cat([state["positional_embedding"][:KEEP_POSITIONS],
                       state["positional_embedding_res"][KEEP_POSITIONS:]])
    model.positional_embedding = torch.nn.Parameter(table)
    model.attn_mask = torch.full((LONG_CONTEXT, LONG_CONTEXT), float("-inf")).triu(1)
    tokens = open_clip.tokenize(CAPTIONS, context_length=LONG_CONTEXT)
    with torch.no_grad():
        images = F.normalize(model.encode_image(_images(coco_like, preprocess)), dim=-1)
        texts = F.normalize(model.encode_text(tokens), dim=-1)
    _assert_scores(got, ((images * texts).sum(-1) + 1) / 2)


def test_a_spec_pt_with_one_position_table_is_one_named_line(coco_like, coco_stand_in, tmp_path, capsys):
    state = torch.load(coco_stand_in.weights("spec.pt"), weights_only=True)
    single = tmp_path / "spec_one_table.pt"
    torch.save({k: v for k, v in state.items() if k != "positional_embedding_res"}, single)
    assert score_cli.main(["--predictions", str(coco_like / "results.json"), "--images", str(coco_like),
                           "--reward-model", f"specs=longclip:{single}", "--metrics", "specs",
                           "--embeds-cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(single) in err and "positional_embedding_res" in err


def test_the_l_clip_papers_student_scores_as_its_towers_do(coco_like, coco_stand_in, tmp_path):
    checkpoint = coco_stand_in.weights("lclip.ckpt")
    saved = torch.load(checkpoint, weights_only=True)
    student = LClip(LClipConfig()).eval()  # the paper's size: 6 / 4 layers from 3 / 2 shared blocks
    student.load_state_dict({k[len("student."):]: v for k, v in saved["state_dict"].items()})
    params = sum(p.numel() for p in student.parameters())
    assert 40_000_000 < params < 50_000_000  # 43.5 M: ViT-B/32 and its text tower halved by sharing
    got = _scores(coco_like, tmp_path, "l_clip_s", f"lclip=lclip:{checkpoint}")
    preprocess = open_clip.transform.image_transform(224, is_train=False)
    with torch.no_grad():
        images = F.normalize(student.encode_image(_images(coco_like, preprocess)), dim=-1)
        texts = F.normalize(student.encode_text(open_clip.tokenize([PREFIX + c for c in CAPTIONS])), dim=-1)
    _assert_scores(got, 2.5 * (images * texts).sum(-1).clamp(min=0))


def test_a_torchscript_archive_is_refused_naming_what_to_use(coco_like, tmp_path, capsys):
    archive = tmp_path / "ViT-B-32.pt"
    with pytest.warns(Warning):
        torch.jit.save(torch.jit.script(torch.nn.Linear(4, 4)), str(archive))
    assert score_cli.main(["--predictions", str(coco_like / "results.json"), "--images", str(coco_like),
                           "--reward-model", f"clip=open_clip:ViT-B-32:{archive}", "--metrics", "clip_s",
                           "--embeds-cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TorchScript archive" in err and "hub tag" in err and str(archive) in err


def test_weights_of_another_architecture_than_the_config_names_are_one_named_line(coco_like, tmp_path, capsys):
    torch.manual_seed(0)
    rn50 = tmp_path / "rn50.safetensors"
    save_file({k: v.contiguous() for k, v in open_clip.create_model("RN50").state_dict().items()}, str(rn50))
    assert score_cli.main(["--predictions", str(coco_like / "results.json"), "--images", str(coco_like),
                           "--reward-model", f"clip=open_clip:ViT-B-32:{rn50}", "--metrics", "clip_s",
                           "--embeds-cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(rn50) in err and "does not match" in err
