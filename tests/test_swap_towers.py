"""rewards.swap_towers: the world's foils scored with each pairing of a teacher's and its student's towers."""

from __future__ import annotations

import json

import torch

from features.clip_models.factory import clip_text_forward
from features.clip_models.lclip import LClip, load_lclip
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.tokens import ClipTokenizer
from rewards import swap_towers
from rewards.recipes import distill
from rewards.recipes.data import load_split
from rewards.recipes.foil_report import foil_accuracy
from tests.clip_fixtures import TINY_ARCH, save_lclip, save_open_clip


def student_of(teacher_path, tmp_path):
    """A student shaped by a distill config for the tiny teacher, started from it, in the DistillCLIP layout."""
    teacher = load_open_clip(TINY_ARCH, str(teacher_path)).model
    cfg = distill.DistillConfig(teacher=str(teacher_path), teacher_arch=TINY_ARCH, out="unused.ckpt")
    torch.manual_seed(0)
    student = LClip(distill.student_config(teacher, cfg))
    distill.init_from_teacher(student, teacher)
    out = tmp_path / "student.ckpt"
    distill.save_student(student, str(out), (0, 0))
    return out


def test_each_pairing_scores_with_the_towers_it_names(tiny_world, tmp_path, capsys):
    teacher_path = save_open_clip(tmp_path / "teacher.safetensors", seed=4)
    student_path = student_of(teacher_path, tmp_path)
    out = tmp_path / "swap.json"
    assert swap_towers.main(["--teacher", str(teacher_path), "--teacher-arch", TINY_ARCH, "--student",
                             str(student_path), "--world", str(tiny_world), "--device", "cpu",
                             "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "rendered foils (val; clip_s; chance 0.5), by pairing of towers" in printed
    assert "foils in the references' wording" in printed
    result = json.loads(out.read_text())
    assert [(p["image"], p["text"]) for p in result["pairings"]] == [
        ("teacher", "teacher"), ("student", "student"), ("teacher", "student"), ("student", "teacher")]

    # each row is what the named towers score when paired by hand
    loaded = load_open_clip(TINY_ARCH, str(teacher_path))
    teacher = loaded.model.eval()
    student = load_lclip(student_path)
    val = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "val")
    towers = {"teacher": (teacher.encode_image, clip_text_forward(teacher)),
              "student": (student.encode_image, student.encode_text)}
    for pairing in result["pairings"][2:]:
        with torch.no_grad():
            report = foil_accuracy(towers[pairing["image"]][0], towers[pairing["text"]][1], ClipTokenizer(77), val,
                                   loaded.preprocess, str(tiny_world / "scenes.json"), "clip_s", torch.device("cpu"))
        assert pairing["world_foils"] == report.rendered
        assert pairing["reference_foils"] == report.references
    assert result["pairings"][2]["world_foils"] != result["pairings"][3]["world_foils"]


def test_a_student_of_another_shape_and_missing_arguments_are_named(tiny_world, tmp_path, capsys):
    teacher_path = save_open_clip(tmp_path / "teacher.safetensors", seed=4)
    other, _ = save_lclip(tmp_path / "other.ckpt")  # 32-d embeddings, 32 px images
    assert swap_towers.main(["--teacher", str(teacher_path), "--teacher-arch", TINY_ARCH, "--student", str(other),
                             "--world", str(tiny_world), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "embedding size 32" in err and "128" in err
    assert swap_towers.main(["--teacher", str(teacher_path), "--world", str(tiny_world)]) == 2
    assert "--student" in capsys.readouterr().err


def test_a_remembered_tower_runs_once_per_distinct_batch():
    """Each tower serves two pairings: the second sees the same batches and gets the first's outputs,
    keyed by content (an equal tensor built anew hits; one changed element, shape or dtype does not)."""
    calls = []

    def encode(batch):
        calls.append(batch.shape)
        return batch.float() * 2

    tower = swap_towers.remembered(encode)
    tokens = torch.tensor([[49406, 320, 49407]])
    first = tower(tokens)
    assert torch.equal(tower(tokens.clone()), first) and len(calls) == 1
    changed = tokens.clone()
    changed[0, 1] = 321
    tower(changed)
    tower(tokens.float())
    tower(tokens.view(3, 1))
    tower(torch.ones(2, 2, dtype=torch.bfloat16))
    assert len(calls) == 5
