"""Hard negatives from caption text alone (rewards/text/edits.py), on real COCO captions: every negative
differs from its caption, a replacement changes one word to another of its kind (checked by parsing the
negative again), a swap moves words without changing them, odd captions do not crash, impossible edits
are counted; `negatives: text` in train_clip and the `text-foils` meta-evaluation task use them."""

from __future__ import annotations

import json
import random

import pytest

from features.coco_rehearsal import sample_captions
from rewards import meta_eval, train_clip
from rewards.text.edits import KINDS, TextEditor, parse_all
from tests.conftest import SHARED_DATA, load_coco_1k

REPLACEMENTS = ("replace_object", "replace_attribute", "replace_count")
SWAPS = ("swap_objects", "swap_attributes", "invert_relation", "shuffle")


@pytest.fixture(scope="module")
def coco_captions() -> list[str]:
    captions = [c for entry in sample_captions() for c in entry["captions"]]
    if SHARED_DATA.exists():  # the 1,000 images beside the repository, when they are there
        captions += [r for entry in load_coco_1k()[200:600] for r in entry["refs"]]
    return captions


@pytest.fixture(scope="module")
def edited(coco_captions):
    editor = TextEditor(coco_captions)
    rng = random.Random(0)
    return editor, [(c, e) for c in coco_captions for e in editor.edits(c, rng, len(KINDS))]


def _words(text: str) -> list[str]:
    return text.lower().split()


def test_every_negative_differs_from_its_caption(edited):
    _, pairs = edited
    assert len(pairs) > 3000
    assert all(e.text.strip().lower() != c.strip().lower() for c, e in pairs)
    assert {e.kind for _, e in pairs} == set(KINDS)


def test_a_replacement_changes_one_word_to_another_of_its_kind(edited):
    editor, pairs = edited
    replaced = [(c, e) for c, e in pairs if e.kind in REPLACEMENTS]
    changed_one, same_kind = 0, 0
    reparsed = parse_all([e.text for _, e in replaced], editor.nlp)
    for caption, edit in replaced:
        before, after = editor.parse(caption), reparsed[edit.text]
        if len(before.words) != len(after.words):
            continue
        diffs = [i for i, (a, b) in enumerate(zip(before.words, after.words, strict=True)) if a.lower() != b.lower()
                 and not {a.lower(), b.lower()} <= {"a", "an"}]
        if len(diffs) == 1:
            changed_one += 1
            same_kind += before.pos[diffs[0]] == after.pos[diffs[0]] or edit.kind == "replace_count"
    assert changed_one == len(replaced)  # one word (and at most its article) every time
    assert same_kind / changed_one > 0.8  # the parse of the negative reads the new word as the old one's kind


def test_a_swap_moves_words_without_changing_them(edited):
    _, pairs = edited
    moved = [(c, e) for c, e in pairs if e.kind in SWAPS]
    assert {e.kind for _, e in moved} == set(SWAPS)
    for caption, edit in moved:  # the same letters, in another order (a word split by a hyphen may move apart)
        assert sorted(edit.text.lower().replace(" ", "")) == sorted(caption.lower().replace(" ", "")), (caption, edit)
        assert _words(edit.text) != _words(caption)


def test_odd_captions_do_not_crash_and_impossible_edits_are_counted(coco_captions):
    odd = ["", "   ", "...", "!!!", "dog", "2", "Two 3 dogs.", "a man -- riding; a horse!!", "A DOG ON A MAT.",
           "\U0001F642 a dog", "a dog's bone", "12 people at 3 tables"]
    editor = TextEditor(coco_captions[:200] + odd)
    rng = random.Random(1)
    for caption in odd:
        for edit in editor.edits(caption, rng, len(KINDS)):
            assert edit.text.strip().lower() != caption.strip().lower()
    assert editor.stats.no_edit[:4] == ["", "   ", "...", "!!!"]
    assert sum(editor.stats.impossible.values()) > 0
    assert "caption(s) admit no edit" in editor.stats.summary()


def test_train_clip_with_text_negatives_needs_no_scenes(tiny_world, tmp_path, capsys):
    out = tmp_path / "text_negatives.safetensors"
    assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                            "--out", str(out), "--epochs", "1", "--set", "batch_size=16", "--set", "workers=0",
                            "--set", "negatives=text", "--set", "hard_negatives=2"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert sum(summary["text_negatives"]["tried"].values()) > 0
    assert "text negatives: impossible edits by kind" in capsys.readouterr().out


def test_text_negatives_where_no_edit_applies_are_named(tmp_path, capsys, karpathy_file):
    data = json.loads(karpathy_file.read_text())
    for image in data["images"]:
        for sentence in image["sentences"]:
            sentence["raw"] = "zebras"
    karpathy_file.write_text(json.dumps(data))
    assert train_clip.main(["--dataset", str(karpathy_file), "--images-root", str(karpathy_file.parent),
                            "--out", str(tmp_path / "x.safetensors"), "--epochs", "1", "--set", "negatives=text",
                            "--set", "text_edits=[replace_count]", "--set", "workers=0"]) == 2
    assert "no edit of replace_count applies to any train caption (e.g. 'zebras')" in capsys.readouterr().err
    assert train_clip.main(["--dataset", str(karpathy_file), "--images-root", str(karpathy_file.parent),
                            "--out", str(tmp_path / "x.safetensors"), "--set", "text_edits=[rewrite]"]) == 2
    assert "text_edits: unknown ['rewrite']" in capsys.readouterr().err


def test_text_foils_of_a_karpathy_file_score_like_any_foil_file(karpathy_file, tmp_path, capsys):
    foils = tmp_path / "foils.json"
    assert meta_eval.main(["text-foils", "--dataset", str(karpathy_file), "--split", "train", "--out", str(foils)]) == 0
    items = json.loads(foils.read_text())
    assert items and all(f["caption"] != item["caption"] and f["kind"] in KINDS
                         for item in items for f in item["foils"])
    assert meta_eval.main(["foil", "--data", str(foils), "--metrics", "bleu_4,cider"]) == 0
    assert "### foil: short" in capsys.readouterr().out


def test_specs_text_negatives_edit_the_caption_and_the_next_unit(tiny_world, tmp_path, capsys):
    """SPECS with `negatives: text` and edited_negatives, no scenes: the hard negatives are the long caption
    edited, each d- is c_j with its next unit edited by text (not another image's unit), and the run counts
    its edits."""
    from rewards.recipes import specs as specs_recipe
    from rewards.recipes.data import load_split
    from rewards.recipes.specificity import detail_units_of, join_units

    cfg = specs_recipe.TrainSpecsConfig(init="x", dataset=str(tiny_world / "dataset.json"),
                                        images_root=str(tiny_world), out="x.pt", negatives="text", hard_negatives=2,
                                        edited_negatives=1.0)
    specs_recipe._validate(cfg)
    train = specs_recipe.with_units(cfg.dataset, load_split(cfg.dataset, cfg.images_root, "train", 0, need_long=True))
    editor = specs_recipe.triplet_editor(train, cfg)
    texts = specs_recipe.triplet_texts(train, cfg, editor)
    rng, edited_units = random.Random(0), 0
    for row in range(len(train.entries)):
        caption, base, positive, negative, *hard = texts(row, rng)
        units = detail_units_of(train.entries[row])[0]
        assert caption == join_units(units) and len(hard) <= 2 and caption not in hard
        assert all(h != caption and len(h.split()) >= len(caption.split()) - 1 for h in hard)
        if negative.startswith(f"{base} ") and negative != positive and negative[len(base) + 1:] not in {
                u for e in train.entries for u in detail_units_of(e)[0]}:
            edited_units += 1
    assert edited_units >= len(train.entries) // 2
    assert sum(editor.stats.tried.values()) > 0
    with pytest.raises(Exception, match="text_edits: unknown"):
        specs_recipe._validate(specs_recipe.TrainSpecsConfig(init="x", dataset="d", images_root="r", out="o",
                                                             negatives="text", text_edits=["rewrite"]))
