"""SPECS and L-CLIP recipes: segmentation, triplets, losses on hand-made numbers, tiny training
runs whose checkpoints load through the reward-model loaders, and bad inputs."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from features.clip_models.factory import load_reward_model
from features.clip_models.lclip import load_lclip
from features.clip_models.longclip import text_heads
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.spec import WORLD_CLIP_ARCH, RewardModelSpec
from features.clip_models.tokens import ClipTokenizer
from features.images import open_rgb
from plumbing.errors import ConfigError, DataError
from rewards import specificity as specificity_cli
from rewards import train_specs
from rewards.recipes import distill as distill_lclip
from rewards.recipes import feature_hints, specificity
from rewards.recipes import specs as specs_recipe
from rewards.recipes.data import load_split
from rewards.recipes.detail_units import DetailSegmenter, split_scores
from rewards.recipes.loop import PairEncoder
from rewards.recipes.specificity import sample_triplets, shuffle_tokens
from rewards.recipes.specs import TrainSpecsConfig, dynamic_margin_hinge, specs_loss
from rewards.recipes.training import file_sha256, lock, unlock
from tests.captioner_fixtures import launch_two_processes
from tests.clip_fixtures import save_open_clip


@pytest.fixture(scope="module")
def segmenter() -> DetailSegmenter:
    return DetailSegmenter()


def test_segmenter_on_the_papers_examples(segmenter):
    front, cat, left = segmenter([
        "A front view of a statue on cement in a park.",
        ("A British Shorthair cat with plush, bluish-gray fur is lounging on a deep green velvet sofa. "
        "The cat is partially tucked under a multi-colored woven blanket."),
        "To the left of the car there is a box.",
    ])
    assert front == ["A front view of a statue on cement in a park."]  # "A front" is not split off
    assert "The cat" not in cat and any(u.startswith("The cat is partially tucked") for u in cat)  # rule 1
    assert left == ["To the left of the car there is a box."]  # rule 3: the leading PP joins what follows
    assert " ".join(cat) == ("A British Shorthair cat with plush, bluish-gray fur is lounging on a deep green velvet "
                             "sofa. The cat is partially tucked under a multi-colored woven blanket.")


def test_split_scores_by_hand_and_on_the_world(segmenter, tiny_world):
    assert split_scores([["a b", "c"]], [["a", "b c"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "captions": 1}
    assert split_scores([["a", "b", "c"]], [["a", "b c"]])["recall"] == 1.0
    images = json.loads((tiny_world / "dataset.json").read_text())["images"]
    truth = [im["long_captions"][0]["detail_units"] for im in images]
    scores = split_scores(segmenter([im["long_captions"][0]["raw"] for im in images]), truth)
    assert scores["precision"] > 0.8 and scores["recall"] > 0.6


def test_triplets_and_the_shuffle_ratio():
    units = [["A big red circle", "with a striped pattern", "appears in the top left corner of the image."],
             ["A small blue square", "appears at the bottom", "next to a green triangle with dots on it"]]
    triplets = sample_triplets(units, random.Random(0), shuffle_ratio=0.0)
    for row, (base, pos, neg) in enumerate(zip(triplets.base, triplets.positive, triplets.negative, strict=True)):
        assert pos.startswith(base) and len(pos) > len(base) and neg.startswith(base + " ")
        assert neg[len(base) + 1:] in units[1 - row]  # a unit of the other image, in order
    rng = random.Random(1)
    unit = "one two three four five six seven eight"
    shuffled = [specificity.negative_unit([[unit], ["x"]], 1, rng, 0.9) for _ in range(2000)]
    rate = sum(s != unit for s in shuffled if sorted(s.split()) == sorted(unit.split())) / 2000
    assert 0.86 < rate < 0.94  # 0.9 requested; an identity permutation is 1 in 40,320
    assert all(specificity.negative_unit([[unit], ["x"]], 1, rng, 1.0) != unit for _ in range(200))
    assert shuffle_tokens("a b c", random.Random(2)).split() != [] and sorted(shuffle_tokens("a b c", rng).split()) == [
        "a", "b", "c"]
    with pytest.raises(DataError, match="detail unit"):
        sample_triplets([["only one unit"], ["a", "b"]], rng)


def test_dynamic_margin_hinge_by_hand():
    bigger = torch.tensor([2.0, 1.0], requires_grad=True)
    smaller = torch.tensor([1.0, 1.5])
    loss, margin = dynamic_margin_hinge(bigger, smaller, max_margin=1.5)
    assert margin == pytest.approx(0.25)  # mean gap (1 - 0.5) / 2
    assert loss.item() == pytest.approx((0 + 0.75) / 2)  # relu(-1 + .25), relu(.5 + .25)
    loss.backward()
    assert bigger.grad.tolist() == [0.0, -0.5]  # the margin is detached: no gradient through the mean
    _, clamped = dynamic_margin_hinge(torch.tensor([5.0]), torch.tensor([0.0]), max_margin=1.5)
    _, floored = dynamic_margin_hinge(torch.tensor([0.0]), torch.tensor([1.0]), max_margin=1.5)
    assert (clamped, floored) == (1.5, 0.0)


def test_specs_loss_weights_its_terms():
    torch.manual_seed(0)

    def unit(n):
        return torch.nn.functional.normalize(torch.randn(n, 8), dim=-1)

    image, caption, base, pos, neg = (unit(4) for _ in range(5))
    scale = torch.tensor(0.0)  # logit scale 1: θ is the cosine itself
    cfg = TrainSpecsConfig(alpha=1.0, beta=8.0, gamma=0.8)
    loss, parts = specs_loss(scale, image, caption, base, pos, neg, cfg)
    assert float(loss) == pytest.approx(parts["contrastive"] + 8 * parts["pos"] + 0.8 * parts["neg"], rel=1e-6)


def test_lclip_losses_by_hand():
    teacher, student = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    assert float(distill_lclip.distill_loss(teacher, student)) == pytest.approx(0.5 * 1.0 + 0.5 * 1.0)
    t_sim = torch.tensor([[0.5, 0.1], [0.2, 0.6]])
    s_sim = torch.tensor([[0.4, 0.3], [0.1, 0.7]])
    # diagonal: relu(.5-.4)=.1, relu(.6-.7)=0; off-diagonal: relu(.3-.1)=.2, relu(.1-.2)=0; / B=2
    assert float(distill_lclip.similarity_regulator(t_sim, s_sim)) == pytest.approx(0.15)


def test_rank_distillation_by_hand():
    """Per image, KL(teacher || student) over its caption and hard negatives: zero when the student
    ranks its texts as the teacher does, positive when it prefers a negative, and its gradient moves
    the student's caption up; padded texts take no part."""
    image = torch.tensor([[1.0, 0.0]])
    teacher_texts = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]])  # caption, negative, padding
    valid = torch.tensor([[True, True, False]])
    scale = torch.tensor(1.0)
    same = distill_lclip.rank_distill_loss(image, teacher_texts, image, teacher_texts.clone(), valid, scale)
    assert float(same) == pytest.approx(0.0, abs=1e-7)
    student_texts = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [5.0, 5.0]]], requires_grad=True)  # swapped
    loss = distill_lclip.rank_distill_loss(image, teacher_texts, image, student_texts, valid, scale)
    p, q = torch.softmax(torch.tensor([1.0, 0.0]), 0), torch.softmax(torch.tensor([0.0, 1.0]), 0)
    assert float(loss.detach()) == pytest.approx(float((p * (p.log() - q.log())).sum()), rel=1e-5)
    loss.backward()
    assert student_texts.grad[0, 0, 0] < 0 and not student_texts.grad[0, 2].any()


@pytest.fixture(scope="module")
def teacher_file(tmp_path_factory):
    return save_open_clip(tmp_path_factory.mktemp("teacher") / "teacher.safetensors", seed=3)


def test_train_specs_round_trips_and_specificity_runs(tiny_world, teacher_file, tmp_path, capsys):
    out, start = tmp_path / "spec.pt", tmp_path / "start.pt"
    start_model = Path(shutil.copy(teacher_file, tmp_path / "world_clip.safetensors"))
    args = ["--init", str(start_model), "--dataset", str(tiny_world / "dataset.json"), "--images-root",
            str(tiny_world), "--out", str(out), "--epochs", "1", "--set", f"start_out={start}", "--set", "batch_size=8"]
    assert train_specs.main([*args, "--set", "workers=0"]) == 0
    mtime = out.stat().st_mtime_ns
    assert train_specs.main(args) == 0  # finished with these settings (workers do not count): skipped
    assert out.stat().st_mtime_ns == mtime
    capsys.readouterr()
    assert train_specs.main([*args, "--epochs", "3"]) == 2  # other settings: refused, nothing overwritten
    assert "epochs: 1 -> 3" in capsys.readouterr().err and out.stat().st_mtime_ns == mtime
    assert json.loads(out.with_suffix(".json").read_text())["starts"] == {"init": file_sha256(start_model)}
    save_open_clip(start_model, seed=4)  # the world CLIP retrained at the same path since
    assert train_specs.main(args) == 2  # built from another start: refused, nothing overwritten
    err = capsys.readouterr().err
    assert f"trained from another init than {start_model} holds now" in err and out.stat().st_mtime_ns == mtime
    trained = load_reward_model(RewardModelSpec(kind="longclip", weights=str(out)))
    assert trained.context_length == 248
    assert load_reward_model(RewardModelSpec(kind="longclip", weights=str(start))).fingerprint != trained.fingerprint
    capsys.readouterr()
    assert specificity_cli.main(["--weights", str(out), "--dataset", str(tiny_world / "dataset.json"),
                             "--images-root", str(tiny_world)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= result["sr_pos"] <= 100 and result["sr_avg"] == pytest.approx((result["sr_pos"] + result["sr_neg"]) / 2)
    assert result["images"] == 12


def test_specs_starts_from_a_world_clip_with_its_text_heads(tmp_path):
    """The world CLIP runs its width-128 text tower as four heads, which the OpenAI layout SPECS starts
    from cannot say; the starting model (already 248 positions, so nothing stretched) reads texts as the
    world CLIP does only if the heads came along."""
    arch = WORLD_CLIP_ARCH
    torch.manual_seed(0)
    clip = load_open_clip(arch).model.eval()
    save_file({k: v.contiguous() for k, v in clip.state_dict().items()}, str(tmp_path / "clip.safetensors"))
    start = specs_recipe.starting_model(TrainSpecsConfig(init=str(tmp_path / "clip.safetensors"), arch=arch))
    assert text_heads(start) == 4
    texts = ["a red star above a blue circle", "two green squares"]
    with torch.no_grad():
        tokens = ClipTokenizer(248)(texts)
        assert torch.allclose(start.encode_text(tokens), clip.encode_text(tokens), atol=1e-5)


def test_specs_can_keep_the_starting_image_tower(tiny_world, tmp_path):
    """lock_image_tower trains the text tower only: the ResNet tower, its batch norms' running statistics
    included, comes out as it went in, while the text tower moves (and unlocked the image tower moves too,
    so the check can fail)."""
    torch.manual_seed(0)
    clip = load_open_clip(WORLD_CLIP_ARCH).model.eval()
    save_file({k: v.contiguous() for k, v in clip.state_dict().items()}, str(tmp_path / "clip.safetensors"))
    settings = dict(init=str(tmp_path / "clip.safetensors"), arch=WORLD_CLIP_ARCH,
                    dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world), epochs=1, batch_size=8,
                    lr=1e-3, warmup_steps=0, workers=0,
                    start_out=str(tmp_path / "start.pt"))

    def trained(name: str, lock: bool) -> dict[str, torch.Tensor]:
        cfg = TrainSpecsConfig(**settings, out=str(tmp_path / name), lock_image_tower=lock)
        specs_recipe.train_specs(cfg, progress=False)
        return torch.load(tmp_path / name, weights_only=True)

    locked, unlocked = trained("locked.pt", True), trained("unlocked.pt", False)
    start = torch.load(tmp_path / "start.pt", weights_only=True)
    image = [k for k in start if k.startswith("visual.")]
    assert any("running_mean" in k for k in image)
    assert all(torch.equal(locked[k], start[k]) for k in image)
    assert not all(torch.equal(locked[k], start[k]) for k in start if k not in image)
    assert not all(torch.equal(unlocked[k], start[k]) for k in image if "running_mean" in k)


def test_a_locked_tower_embeds_in_training_as_it_scores():
    """While the rest trains, a locked ResNet tower stays in eval mode, so its batch norms read their
    running statistics: a training step sees the embedding a scorer sees, whatever else is in the
    batch. Unlocked, training mode returns (batch statistics: the check can fail)."""
    torch.manual_seed(0)
    clip = load_open_clip(WORLD_CLIP_ARCH).model.eval()
    images = torch.randn(4, 3, clip.visual.image_size, clip.visual.image_size)
    with torch.no_grad():
        scored = clip.encode_image(images)
        pair = PairEncoder.of_clip(clip)
        lock(clip.visual)
        pair.train()
        assert clip.transformer.training and not clip.visual.training
        clip.visual.train(True)  # a helper restoring the mode it found cannot undo the lock
        assert not clip.visual.training
        assert torch.allclose(pair(images, None).image, scored, atol=1e-5)
        assert torch.allclose(pair(images[:2], None).image, scored[:2], atol=1e-5)
        unlock(clip.visual)
        pair.train()
        assert clip.visual.training
        assert not torch.allclose(pair(images, None).image, scored, atol=1e-3)


def test_distill_round_trips_and_shrinks(tiny_world, teacher_file, tmp_path):
    out = tmp_path / "lclip.ckpt"
    settings = dict(teacher=str(teacher_file), dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world),
                    out=str(out), stage1_epochs=1, stage2_epochs=1, batch_size=16)
    summary = distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings, workers=0), progress=False)
    mtime = out.stat().st_mtime_ns
    again = distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings), progress=False)
    assert again["student_params"] == summary["student_params"]  # finished: the summary, nothing retrained
    assert out.stat().st_mtime_ns == mtime
    with pytest.raises(ConfigError, match="stage1_epochs: 1 -> 2"):
        distill_lclip.distill_lclip(distill_lclip.DistillConfig(**{**settings, "stage1_epochs": 2}), progress=False)
    student = load_reward_model(RewardModelSpec(kind="lclip", weights=str(out)))
    assert summary["student_params"] <= 0.5 * summary["teacher_params"]
    assert sum(p.numel() for p in student.module.parameters()) == summary["student_params"]
    assert {"student_i2t_r1", "teacher_i2t_r1", "student_match_acc"} <= set(summary)


def test_distill_stage2_freezes_the_students_text_tower(tiny_world, teacher_file, tmp_path):
    """The paper's stage 2 trains the image tower with the language encoder frozen: after stage 2
    alone, the student's text tower is still its initialisation from the teacher (and it moves when
    stage2_freeze_text is off, so the check can fail)."""
    settings = dict(teacher=str(teacher_file), dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world),
                    stage1_epochs=0, stage2_epochs=1, stage2_lr=1e-3, batch_size=16, workers=0)

    def text_tower(out: Path) -> dict[str, torch.Tensor]:
        return {k: v for k, v in load_lclip(out).state_dict().items() if k.startswith("text_encoder.")}

    frozen, trained = tmp_path / "frozen.ckpt", tmp_path / "trained.ckpt"
    distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings, out=str(frozen)), progress=False)
    distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings, out=str(trained), stage2_freeze_text=False),
                                progress=False)
    teacher = load_open_clip("world-clip-tiny", str(teacher_file)).model
    start = distill_lclip.LClip(distill_lclip.student_config(teacher, distill_lclip.DistillConfig(**settings, out="x")))
    distill_lclip.init_from_teacher(start, teacher)
    initial = {k: v for k, v in start.state_dict().items() if k.startswith("text_encoder.")}
    assert all(torch.equal(v, initial[k]) for k, v in text_tower(frozen).items())
    assert not all(torch.equal(v, initial[k]) for k, v in text_tower(trained).items())
    image = [k for k in start.state_dict() if k.startswith("image_encoder.")]
    assert not all(torch.equal(load_lclip(frozen).state_dict()[k], start.state_dict()[k]) for k in image)


def test_the_student_keeps_its_teachers_text_heads_through_its_checkpoint(tmp_path):
    """The world CLIP's width-128 text tower runs four heads; a student built at width // 64 (two) would
    copy its blocks into another computation. At full rank and unshared blocks the student's text
    tower starts as the teacher's (cosine above 0.999), and the checkpoint's hyper_parameters carry the
    heads to every loader; without them the same weights read texts otherwise."""
    torch.manual_seed(0)
    teacher = load_open_clip(WORLD_CLIP_ARCH).model.eval()
    cfg = distill_lclip.DistillConfig(stem_channels=[8, 16, 32], vision_width=128, repeats=1, embed_rank=128)
    student = distill_lclip.LClip(distill_lclip.student_config(teacher, cfg))
    assert student.config.text_heads == text_heads(teacher) == 4
    distill_lclip.init_from_teacher(student, teacher)
    tokens = ClipTokenizer(int(teacher.context_length))(["a red star above a blue circle", "two green squares"])

    def cosine(encode) -> torch.Tensor:  # the student's GELU is not the teacher's quick one: close, not equal
        with torch.no_grad():
            return F.cosine_similarity(encode(tokens), teacher.encode_text(tokens)).min()

    assert cosine(student.eval().encode_text) > 0.999
    path = tmp_path / "student.ckpt"
    distill_lclip.save_student(student, str(path), stage_epochs=(0, 0))
    loaded = load_reward_model(RewardModelSpec(kind="lclip", weights=str(path)))
    assert loaded.module.config.text_heads == 4 and loaded.module.config.vision_heads == 2
    checkpoint = torch.load(path, weights_only=True)
    torch.save({k: v for k, v in checkpoint.items() if k != "hyper_parameters"}, tmp_path / "bare.ckpt")
    bare = load_lclip(tmp_path / "bare.ckpt")
    assert cosine(loaded.module.encode_text) > 0.999
    assert bare.config.text_heads == 2 and cosine(bare.encode_text) < 0.99, float(cosine(bare.encode_text))
    for value, message in ((3, "text_heads 3 does not divide the tower's width 128"),
                           ("4", "hyper_parameters.text_heads must be a positive integer")):
        torch.save({**checkpoint, "hyper_parameters": {"text_heads": value}}, tmp_path / "bad.ckpt")
        with pytest.raises(DataError, match=f"bad.ckpt: {message}"):
            load_lclip(tmp_path / "bad.ckpt")
    with pytest.raises(ConfigError, match="text_heads 3 does not divide the teacher's text width 128"):
        distill_lclip.student_config(teacher, dataclasses.replace(cfg, text_heads=3))


def test_the_students_token_embedding_can_start_from_the_rows_the_captions_use(tiny_world, teacher_file):
    """embed_init: used: the factorised embedding's directions come from the rows the train captions use,
    so those rows start closer to the teacher's than under the plain SVD, which the default keeps
    (u * s and v, as before the option)."""
    teacher = load_open_clip("world-clip-tiny", str(teacher_file)).model
    cfg = distill_lclip.DistillConfig(teacher=str(teacher_file), dataset=str(tiny_world / "dataset.json"),
                                      images_root=str(tiny_world), out="x", embed_rank=8)
    train = load_split(cfg.dataset, cfg.images_root, "train", 0)
    tokenizer = ClipTokenizer(int(teacher.context_length))
    counts = distill_lclip.token_counts(tokenizer, train, teacher.token_embedding.weight.shape[0])
    assert counts.sum() == sum(len(tokenizer.ids([t])[0]) for pool in train.pool("both") for t in pool)
    used = counts > 0
    table = teacher.token_embedding.weight.detach()

    def start(token_counts: torch.Tensor | None) -> torch.Tensor:
        student = distill_lclip.LClip(distill_lclip.student_config(teacher, cfg))
        distill_lclip.init_from_teacher(student, teacher, token_counts)
        text = student.text_encoder
        return (text.token_embedding.weight @ text.token_projection.weight.t()).detach()

    plain, weighted = start(None), start(counts)
    u, s, v = torch.linalg.svd(table.float(), full_matrices=False)
    assert torch.allclose(plain, (u[:, :8] * s[:8]) @ v[:8], atol=1e-5)

    def error(rows: torch.Tensor) -> float:  # what the weighted SVD minimises over rank-8 tables
        return float(((rows[used] - table[used]).pow(2).sum(dim=1) * counts[used]).sum())

    assert error(weighted) < 0.8 * error(plain)


def test_distill_pretrains_the_students_image_tower_first(tiny_world, teacher_file, tmp_path):
    """vision_pretrain_epochs: a scene-label stage on the student's image tower, logged before the two
    distillation stages; the checkpoint still loads through the lclip loader, and the stage needs scenes."""
    settings = dict(teacher=str(teacher_file), dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world),
                    stage1_epochs=1, stage2_epochs=1, batch_size=16, workers=0, vision_pretrain_epochs=2)
    with pytest.raises(ConfigError, match="vision_pretrain_epochs needs 'scenes'"):
        distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings, out=str(tmp_path / "x.ckpt")),
                                    progress=False)
    out = tmp_path / "pre.ckpt"
    distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings, out=str(out), negatives="world",
                                                            scenes=str(tiny_world / "scenes.json")), progress=False)
    logged = [json.loads(line) for line in out.with_suffix(".log.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in logged] == ["vision", "vision", "stage1", "stage2"]
    assert logged[1]["train_loss"] < logged[0]["train_loss"]  # the labels are learned from
    load_reward_model(RewardModelSpec(kind="lclip", weights=str(out)))


def test_hints_are_the_teachers_last_map_pooled_and_normed(tiny_world):
    """teacher_hints: a ResNet teacher's last stage (what its attention pool reads), computed here
    stage by stage, pooled to the coarser grid and layer-normed per token; a ViT teacher's last
    patch tokens; and each image's embedding from the same forward."""
    train = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train", limit=6)
    for arch, side in (("world-clip-rn16", 2), ("world-clip-tiny", 4)):
        torch.manual_seed(0)
        loaded = load_open_clip(arch)
        visual = loaded.model.visual.eval()
        assert feature_hints.hint_side(visual, 4, torch.device("cpu")) == side  # the coarser of 4x4 and its own
        hints, embeddings = feature_hints.teacher_hints(visual, train, loaded.preprocess, side, torch.device("cpu"), 0)
        with torch.no_grad():
            image = loaded.preprocess(open_rgb(train.paths[2])).unsqueeze(0)
            if arch == "world-clip-rn16":
                grid = visual.layer4(visual.layer3(visual.layer2(visual.layer1(visual.stem(image)))))
            else:
                tokens = visual.transformer(visual.ln_pre(torch.cat(
                    [visual.class_embedding.expand(1, 1, -1), visual.conv1(image).flatten(2).transpose(1, 2)], 1)
                    + visual.positional_embedding))
                grid = tokens[:, 1:].transpose(1, 2).reshape(1, -1, 8, 8)
        expected = F.adaptive_avg_pool2d(grid, side).flatten(2).transpose(1, 2)[0]
        expected = (expected - expected.mean(-1, keepdim=True)) / expected.std(-1, correction=0, keepdim=True)
        assert hints.shape == (6, side * side, grid.shape[1])
        torch.testing.assert_close(hints[2], expected, atol=1e-4, rtol=1e-4)
        with torch.no_grad():  # the embeddings come from the same forward, as the tower gives them
            torch.testing.assert_close(embeddings[2], visual(image)[0], atol=1e-4, rtol=1e-4)


def test_hint_views_are_the_pictures_mirrored_with_the_teachers_answers_for_each(tiny_world):
    """hint_flips: a view's tensor is the mirrored picture preprocessed (the world's images are square),
    and its targets are the teacher's map and embedding of that mirrored picture, view-major."""
    train = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train", limit=5)
    torch.manual_seed(0)
    loaded = load_open_clip("world-clip-rn16")
    visual = loaded.model.visual.eval()
    picture = open_rgb(train.paths[3])
    mirrored = loaded.preprocess(picture.transpose(0)).unsqueeze(0)  # PIL: FLIP_LEFT_RIGHT
    upside_down = loaded.preprocess(picture.transpose(1)).unsqueeze(0)  # FLIP_TOP_BOTTOM
    flipped = feature_hints.flip_images(loaded.preprocess(picture).unsqueeze(0), ("horizontal",))
    torch.testing.assert_close(flipped, mirrored)
    views = [(), ("horizontal",), ("vertical",), ("horizontal", "vertical")]
    hints, embeddings = feature_hints.teacher_hints(visual, train, loaded.preprocess, 2, torch.device("cpu"), 0,
                                                    views=views)
    assert hints.shape[0] == embeddings.shape[0] == 4 * 5
    with torch.no_grad():
        torch.testing.assert_close(embeddings[1 * 5 + 3], visual(mirrored)[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(embeddings[2 * 5 + 3], visual(upside_down)[0], atol=1e-4, rtol=1e-4)
    data = feature_hints.FlippedViews(train, loaded.preprocess, (hints, embeddings), views)
    assert len(data) == 20
    image, (hint, embedding), error = data[2 * 5 + 3]
    assert error == "" and torch.equal(embedding, embeddings[13]) and torch.equal(hint, hints[13])
    torch.testing.assert_close(image.unsqueeze(0), upside_down)
    with pytest.raises(ValueError, match="targets for 5 images in 2 views"):
        feature_hints.FlippedViews(train, loaded.preprocess, hints, views[:2])


def test_readout_projection_is_the_least_squares_map_to_the_teachers_embeddings(tiny_world):
    """hint_projection: the student's projection becomes the ridge readout of the teacher's image
    embeddings from its normed class token: below a random projection's error, and at a minimum
    (any small step away raises the ridge objective)."""
    train = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train", limit=12)
    torch.manual_seed(0)
    loaded = load_open_clip("world-clip-rn16")
    teacher = loaded.model.visual.eval()
    settings = dict(teacher="x", dataset="x", images_root="x", out="x", stem_channels=[8, 16], vision_width=32)
    tower = distill_lclip.LClip(distill_lclip.student_config(loaded.model, distill_lclip.DistillConfig(**settings)))
    tower = tower.image_encoder.eval()
    images = torch.stack([loaded.preprocess(open_rgb(path)) for path in train.paths])
    with torch.no_grad():
        x = tower.ln_post(tower.tokens(images)[:, 0]).double()
        y = teacher(images).double()
    ridge = 1e-3 * (x * x).sum(0).mean()

    def objective(w: torch.Tensor) -> float:
        return float(((x @ w - y) ** 2).sum() + ridge * (w * w).sum())

    before = objective(tower.proj.detach().double())
    feature_hints.readout_projection(tower, y.float(), train, loaded.preprocess, torch.device("cpu"), 0)
    fitted = tower.proj.detach().double()
    assert objective(fitted) < 0.5 * before
    for _ in range(3):
        assert objective(fitted + 1e-3 * torch.randn_like(fitted)) > objective(fitted)


def test_distill_hint_stage_teaches_the_students_tower_the_teachers_map(tiny_world, teacher_file, tmp_path):
    """hint_epochs: a stage before stage 1 in which the student's patch tokens learn the teacher's
    last map (the loss falls); the adapter is not saved, the checkpoint loads through the lclip loader."""
    out = tmp_path / "hints.ckpt"
    settings = dict(teacher=str(teacher_file), dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world),
                    out=str(out), stage1_epochs=1, stage2_epochs=1, batch_size=16, workers=0, hint_epochs=3)
    distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings), progress=False)
    logged = [json.loads(line) for line in out.with_suffix(".log.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in logged] == ["hints", "hints", "hints", "stage1", "stage2"]
    assert all(r["seconds"] > 0 for r in logged)  # each epoch's wall time
    assert logged[2]["train_loss"] < logged[0]["train_loss"]
    assert logged[2]["hint_cosine"] > logged[0]["hint_cosine"]
    state = torch.load(out, weights_only=True)["state_dict"]
    assert not any("adapter" in key for key in state)
    load_reward_model(RewardModelSpec(kind="lclip", weights=str(out)))


def test_whitening_makes_every_direction_the_embeddings_vary_along_count_alike():
    """The hints' whitened term: on embeddings whose directions vary by four orders of magnitude, the
    whitened covariance is the identity up to the ridge, and a small error along the quietest direction
    costs what the same error in standard deviations costs along the loudest."""
    generator = torch.Generator().manual_seed(0)
    scales = torch.tensor([1.0, 0.3, 0.03, 0.003])
    embeddings = torch.cat([torch.ones(4000, 1) * 5, torch.randn(4000, 4, generator=generator) * scales], dim=1)
    whiten = feature_hints.whitening(embeddings, ridge=1e-9)
    unit = F.normalize(embeddings, dim=-1)
    spread = whiten @ torch.cov(unit.T) @ whiten
    assert torch.allclose(spread.diagonal()[1:], torch.ones(4), atol=1e-3)
    teacher = torch.eye(5)[:1]  # the mean direction: a small step from it stays a step on the sphere
    loud, quiet = (teacher + 0.01 * torch.eye(5)[k] * unit[:, k].std() for k in (1, 4))  # 0.01 sd each
    loud_cost, quiet_cost = (feature_hints.whitened_error(teacher, s, whiten) for s in (loud, quiet))
    assert quiet_cost == pytest.approx(float(loud_cost), rel=0.05)
    assert float(F.mse_loss(quiet, teacher)) < 1e-4 * float(F.mse_loss(loud, teacher))  # raw, it hardly counts
    assert feature_hints.whitened_error(teacher, 3 * teacher, whiten) == 0  # normalised: scale is not an error


def test_distill_hints_can_also_teach_the_teachers_image_embeddings(tiny_world, teacher_file, tmp_path):
    """hint_embedding_weight and hint_whitened_weight: L_D and the whitened error between the student's
    image embedding and the teacher's join the hints stage (logged as image_ld and whitened, falling),
    here over mirrored views too (hint_flips); all are parts of that stage, so they need hint_epochs."""
    out = tmp_path / "hints_ld.ckpt"
    settings = dict(teacher=str(teacher_file), dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world),
                    out=str(out), stage1_epochs=0, stage2_epochs=1, batch_size=16, workers=0, hint_epochs=4,
                    hint_embedding_weight=1.0, hint_whitened_weight=1.0, lr=2e-3, hint_flips=["horizontal"])
    distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings), progress=False)
    hints = [json.loads(line) for line in out.with_suffix(".log.jsonl").read_text().splitlines()][:4]
    assert all(r["stage"] == "hints" and "image_ld" in r and "whitened" in r for r in hints)
    assert hints[-1]["image_ld"] < hints[0]["image_ld"]
    assert hints[-1]["whitened"] < hints[0]["whitened"]
    load_reward_model(RewardModelSpec(kind="lclip", weights=str(out)))
    for change, message in (({"hint_epochs": 0, "hint_flips": []}, "hint_embedding_weight .* needs hint_epochs"),
                            ({"hint_epochs": 0, "hint_flips": [], "hint_embedding_weight": 0},
                             "hint_whitened_weight .* needs hint_epochs"),
                            ({"hint_epochs": 0, "hint_embedding_weight": 0, "hint_whitened_weight": 0},
                             "hint_flips .* needs hint_epochs"),
                            ({"hint_flips": ["diagonal"]}, "hint_flips: unknown \\['diagonal'\\]")):
        with pytest.raises(ConfigError, match=message):
            distill_lclip.distill_lclip(distill_lclip.DistillConfig(**{**settings, **change,
                                                                       "out": str(tmp_path / "x.ckpt")}),
                                        progress=False)


def test_distill_interrupted_in_its_hint_stage_resumes_to_the_same_student(tiny_world, teacher_file, tmp_path,
                                                                          monkeypatch):
    settings = dict(teacher=str(teacher_file), dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world),
                    stage1_epochs=1, stage2_epochs=1, batch_size=16, workers=0, hint_epochs=3,
                    negatives="world", scenes=str(tiny_world / "scenes.json"))
    once, twice = tmp_path / "once.ckpt", tmp_path / "twice.ckpt"
    distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings, out=str(once)), progress=False)
    real, calls = feature_hints.hint_step, {"n": 0}

    def interrupted(model, batch, **terms):
        calls["n"] += 1
        if calls["n"] == 4:  # in the second of three hint epochs (2 steps each)
            raise KeyboardInterrupt
        return real(model, batch, **terms)

    monkeypatch.setattr(feature_hints, "hint_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings, out=str(twice)), progress=False)
    assert not twice.exists()
    monkeypatch.setattr(feature_hints, "hint_step", real)
    distill_lclip.distill_lclip(distill_lclip.DistillConfig(**settings, out=str(twice)), progress=False)
    first, second = (torch.load(path, weights_only=True)["state_dict"] for path in (once, twice))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_distill_runs_under_two_processes(tiny_world, teacher_file, tmp_path):
    """`accelerate launch` with two processes through scene labels, hints and both stages: DDP waits for
    every parameter that asks for a gradient, so the parameters no stage's loss reads (the tower's output
    norm and projection in the hints without their embedding term, the student's temperature) ask for none."""
    import yaml

    out = tmp_path / "ddp.ckpt"
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(dict(
        teacher=str(teacher_file), dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world),
        scenes=str(tiny_world / "scenes.json"), out=str(out), batch_size=16, workers=0, vision_pretrain_epochs=1,
        hint_epochs=1, stage1_epochs=1, stage2_epochs=1, negatives="world")))
    result = launch_two_processes(config, "rewards.distill_lclip")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    load_reward_model(RewardModelSpec(kind="lclip", weights=str(out)))


def test_recipe_bad_inputs(tiny_world, teacher_file, tmp_path):
    no_units = json.loads((tiny_world / "dataset.json").read_text())
    for image in no_units["images"]:
        image.pop("long_captions", None)
    (tmp_path / "plain.json").write_text(json.dumps(no_units))
    assert specificity_cli.main(["--weights", str(teacher_file), "--kind", "open_clip", "--dataset",
                             str(tmp_path / "plain.json"), "--images-root", str(tiny_world)]) == 2
    assert train_specs.main(["--init", str(teacher_file), "--dataset", str(tmp_path / "plain.json"),
                             "--images-root", str(tiny_world), "--out", str(tmp_path / "s.pt")]) == 2
    with pytest.raises(ConfigError, match="embed_dim 64 differs from the teacher's 128"):
        distill_lclip.distill_lclip(distill_lclip.DistillConfig(
            teacher=str(teacher_file), dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world),
            out=str(tmp_path / "l.ckpt"), embed_dim=64), progress=False)


def test_world_negatives_name_an_absent_object(tiny_world):
    from features.world.parse import parse_caption
    from features.world.scene import load_scenes
    from plumbing.karpathy import load_dataset
    from rewards.recipes.specificity import detail_units_of, scene_negative_filter

    entries = load_dataset(tiny_world / "dataset.json")[:10]
    scenes = load_scenes(tiny_world / "scenes.json")
    ids = [e.image_id for e in entries]
    allowed = scene_negative_filter(scenes, ids)
    units = [detail_units_of(e)[0] for e in entries]
    triplets = sample_triplets(units, random.Random(0), shuffle_ratio=0.0, allowed=allowed)
    for row, (base, neg) in enumerate(zip(triplets.base, triplets.negative, strict=True)):
        present = {(o.color, o.shape) for o in scenes[ids[row]].objects}
        named = {(m.color, m.shape) for m in parse_caption(neg[len(base):]).mentions}
        assert named and not named & present


def test_edited_negative_units_change_the_added_unit_and_are_false_of_the_scene(tiny_world):
    """SPECS's edited d-: the true next unit with one fact changed, judged by the world parser (not
    the generator): the prefix c_j is kept word for word and the scene contradicts the result."""
    from features.world.parse import contradictions, parse_caption
    from features.world.scene import load_scenes
    from plumbing.karpathy import load_dataset
    from rewards.recipes.specificity import detail_units_of, join_units

    entries = load_dataset(tiny_world / "dataset.json")
    scenes = load_scenes(tiny_world / "scenes.json")
    rng, made = random.Random(0), 0
    for entry in entries:
        units, scene = detail_units_of(entry)[0], scenes[entry.image_id]
        for j in range(1, len(units)):
            base, positive = join_units(units[:j]), join_units(units[: j + 1])
            edited = specs_recipe.edited_unit(base, positive, scene, rng)
            if edited is None:
                continue
            made += 1
            assert edited.startswith(f"{base} ") and edited != positive
            assert contradictions(parse_caption(positive), scene) == [], positive
            assert contradictions(parse_caption(edited), scene), (positive, edited)
    assert made >= len(entries)  # most units have a fact to change


def test_edited_negatives_need_scenes(tiny_world, teacher_file, tmp_path):
    with pytest.raises(ConfigError, match="edited_negatives needs 'scenes'"):
        specs_recipe.train_specs(TrainSpecsConfig(init=str(teacher_file), dataset=str(tiny_world / "dataset.json"),
                                                  images_root=str(tiny_world), out=str(tmp_path / "s.pt"),
                                                  edited_negatives=0.5), progress=False)


def test_lclip_bench_times_an_untrained_student_shaped_by_a_distill_config(tmp_path, capsys):
    """Without --student the bench builds the student its --student-config describes (a ResNet teacher
    needs a conv stem, which DistillConfig's defaults lack); a missing config file is a clear error."""
    from rewards import bench

    config = tmp_path / "student.yaml"
    config.write_text("vision_width: 64\nstem_channels: [8, 16, 32]\nstem_norm: true\n")
    assert bench.main(["lclip", "--repeats", "1", "--student-config", str(config)]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["student"] == "an untrained L-CLIP student" and 0 < row["param_ratio"] < 0.5
    assert bench.main(["lclip", "--student-config", str(tmp_path / "missing.yaml")]) != 0
    assert "missing.yaml" in capsys.readouterr().err
