"""Bring your own images: caption a plain folder with a trained checkpoint, score the captions
against the folder with a real open_clip model, and every bad input is a named error or skip."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from captioner import caption as caption_cli
from captioner import evaluate as evaluate_cli
from captioner import train as train_cli
from rewards import score as score_cli
from tests.captioner_fixtures import prepare_tiny_data, tiny_config
from tests.clip_fixtures import TINY_ARCH, save_open_clip, write_embeds


@pytest.fixture(scope="module")
def trained(tiny_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    data = prepare_tiny_data(tiny_world, root)
    cfg = tiny_config(data, root, name="xe", train={"epochs": 2})
    assert train_cli.main(["--config", str(cfg), "--no-progress"]) == 0
    folder = root / "photos"
    folder.mkdir()
    images = json.loads((tiny_world / "dataset.json").read_text())["images"]
    test = [im for im in images if im["split"] == "test"]
    for im in test:
        shutil.copy(tiny_world / im["filepath"] / im["filename"], folder / im["filename"])
    return {"root": root, "ckpt": root / "xe" / "checkpoints" / "best", "folder": folder, "test": test}


DECODE = ["--beam", "2", "--block-trigrams", "--remove-bad-endings"]


def test_captions_of_a_plain_folder_equal_evaluate_on_the_same_images(trained, tmp_path):
    out = tmp_path / "results.json"
    assert caption_cli.main(["--checkpoint", str(trained["ckpt"]), "--images", str(trained["folder"]),
                             "--out", str(out), "--batch-size", "16", "--workers", "0", *DECODE]) == 0
    mine = {e["image_id"]: e["caption"] for e in json.loads(out.read_text())}
    assert evaluate_cli.main(["--checkpoint", str(trained["ckpt"]), "--split", "test", "--out",
                              str(tmp_path / "eval.json"), *DECODE]) == 0
    theirs = {e["image_id"]: e["caption"] for e in json.loads((tmp_path / "eval.json").read_text())}
    assert mine == theirs and len(mine) == len(trained["test"])


def test_sample_n_and_the_coco_test_server_name(trained, tmp_path):
    assert caption_cli.main(["--checkpoint", str(trained["ckpt"]), "--images", str(trained["folder"]),
                             "--out", str(tmp_path), "--coco-test-naming", "--alg", "mine", "--sample-n", "3",
                             "--top-p", "0.9", "--workers", "0", "--report", str(tmp_path / "report")]) == 0
    entries = json.loads((tmp_path / "captions_test2014_mine_results.json").read_text())
    assert len(entries) == 3 * len(trained["test"]) and set(entries[0]) == {"image_id", "caption"}
    assert (tmp_path / "report" / "captions.png").stat().st_size > 1000
    assert "| world_" in (tmp_path / "report" / "captions.md").read_text()


def test_on_the_fly_clip_s_equals_clip_s_from_extracted_embeddings(trained, tiny_world, tmp_path):
    results = tmp_path / "results.json"
    assert caption_cli.main(["--checkpoint", str(trained["ckpt"]), "--images", str(trained["folder"]),
                             "--out", str(results), "--workers", "0"]) == 0
    weights = save_open_clip(tmp_path / "clip.safetensors", seed=4)
    per_item = tmp_path / "per_item.json"
    assert score_cli.main(["--predictions", str(results), "--images", str(trained["folder"]), "--reward-model",
                           f"clip=open_clip:{TINY_ARCH}:{weights}", "--embeds-cache", str(tmp_path / "cache"),
                           "--metrics", "clip_s,bleu_4,mean_length", "--out", str(tmp_path / "s.json"),
                           "--save-per-instance", str(per_item)]) == 0
    scores = json.loads((tmp_path / "s.json").read_text())
    assert "needs reference captions" in scores["skipped"]["bleu_4"] and "clip_s" in scores["corpus"]
    embeds = write_embeds(tiny_world, f"open_clip:{TINY_ARCH}", weights, tmp_path / "clip.h5")
    config = tmp_path / "scoring.yaml"
    config.write_text(json.dumps({"reward_models": {"clip": {"arch": TINY_ARCH, "weights": str(weights),
                                                             "embeds": str(embeds)}}}))
    assert score_cli.main(["--config", str(config), "--predictions", str(results), "--references",
                           str(tiny_world / "dataset.json"), "--split", "test", "--metrics", "clip_s,bleu_4",
                           "--out", str(tmp_path / "ref.json")]) == 0
    reference = json.loads((tmp_path / "ref.json").read_text())["per_item"]["clip_s"]
    on_the_fly = json.loads(per_item.read_text())
    assert set(reference) == set(on_the_fly)
    for image_id, value in reference.items():
        assert abs(on_the_fly[image_id]["clip_s"] - value) < 1e-5
    assert list(tmp_path.glob("cache/*/*.h5"))  # cached under the model's fingerprint


def test_unreadable_files_are_skipped_and_bad_inputs_are_named(trained, tmp_path, capsys):
    folder = tmp_path / "mixed"
    shutil.copytree(trained["folder"], folder)
    (folder / "notes.txt").write_text("not an image")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    out = tmp_path / "r.json"
    assert caption_cli.main(["--checkpoint", str(trained["ckpt"]), "--images", str(folder), "--out", str(out),
                             "--workers", "0"]) == 0
    err = capsys.readouterr().err
    assert "skipped" in err and "notes.txt" in err and "broken.png" in err
    assert {e["file_name"] for e in json.loads(out.read_text())} == {im["filename"] for im in trained["test"]}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert caption_cli.main(["--checkpoint", str(trained["ckpt"]), "--images", str(empty),
                             "--out", str(tmp_path / "none.json")]) == 2
    assert "no image files" in capsys.readouterr().err and not (tmp_path / "none.json").exists()
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a.txt").write_text("x")
    assert caption_cli.main(["--checkpoint", str(trained["ckpt"]), "--images", str(junk),
                             "--out", str(tmp_path / "junk.json"), "--workers", "0"]) == 2
    assert "is a readable image" in capsys.readouterr().err and not (tmp_path / "junk.json").exists()


def test_a_checkpoint_on_other_open_clip_weights_is_refused(tiny_world, tmp_path, capsys):
    from features.extract import ExtractConfig, extract

    data = prepare_tiny_data(tiny_world, tmp_path)
    weights, other = save_open_clip(tmp_path / "w.safetensors", 0), save_open_clip(tmp_path / "o.safetensors", 1)
    extract(ExtractConfig(dataset=str(tiny_world / "dataset.json"), images_root=str(tiny_world),
                          backbone=f"open_clip:{TINY_ARCH}", pretrained=str(weights), out=str(tmp_path / "clip.h5"),
                          workers=0), progress=False)
    cfg = tiny_config({**data, "feats": str(tmp_path / "clip.h5")}, tmp_path, name="oc", train={"epochs": 1},
                      model={"visual_stem": "linear"})
    assert train_cli.main(["--config", str(cfg), "--no-progress"]) == 0
    ckpt = tmp_path / "oc" / "checkpoints" / "last"
    args = ["--checkpoint", str(ckpt), "--images", str(tiny_world / "images"), "--workers", "0"]
    assert caption_cli.main([*args, "--out", str(tmp_path / "bad.json"), "--pretrained", str(other)]) == 2
    assert "fingerprint" in capsys.readouterr().err and not (tmp_path / "bad.json").exists()
    assert caption_cli.main([*args, "--out", str(tmp_path / "good.json"), "--pretrained", str(weights)]) == 0
    assert torch.tensor(len(json.loads((tmp_path / "good.json").read_text()))) == 64


def test_predictions_find_their_images_by_the_number_in_the_name_beside_other_files(trained, tmp_path, capsys):
    """A README or a file without a number in the image folder does not change which image an id
    names (it did: every id fell back to a file position); two files with one id are an error naming both."""
    predictions = tmp_path / "by_id.json"
    predictions.write_text(json.dumps([{"image_id": im["imgid"], "caption": im["sentences"][0]["raw"]}
                                       for im in trained["test"]]))
    weights = save_open_clip(tmp_path / "clip.safetensors", seed=4)

    def clip_s(folder) -> int:
        return score_cli.main(["--predictions", str(predictions), "--images", str(folder), "--reward-model",
                               f"clip=open_clip:{TINY_ARCH}:{weights}", "--embeds-cache", str(tmp_path / "cache"),
                               "--metrics", "clip_s", "--out", str(tmp_path / "s.json"),
                               "--save-per-instance", str(tmp_path / "per_item.json")])

    assert clip_s(trained["folder"]) == 0
    alone = json.loads((tmp_path / "per_item.json").read_text())
    folder = tmp_path / "with_readme"
    shutil.copytree(trained["folder"], folder)
    (folder / "README.txt").write_text("the test images")
    assert clip_s(folder) == 0
    assert json.loads((tmp_path / "per_item.json").read_text()) == alone
    first = sorted(folder.glob("world_*.png"))[0]
    shutil.copy(first, folder / f"copy_of_{int(first.stem.split('_')[-1])}.png")
    assert clip_s(folder) == 2
    err = capsys.readouterr().err
    assert f"image id {int(first.stem.split('_')[-1])} matches 2 files" in err and first.name in err
