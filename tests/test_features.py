from __future__ import annotations

import json
import re
import shutil

import h5py
import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from features import extract as extract_cli
from features.clip_models.checkpoints import fingerprint, load_state_dict_file
from features.extract import ExtractConfig, extract
from features.import_npz import ImportConfig, import_npz
from features.store import FeatureReader
from plumbing.errors import ConfigError, DataError


def cfg_for(world, out, **kw):
    kw = {"workers": 0, "batch_size": 8, **kw}
    return ExtractConfig(dataset=str(world / "dataset.json"), images_root=str(world), out=str(out), **kw)


def read_all(path):
    with h5py.File(path, "r") as h5:
        return {k: h5[k][:] for k in h5}, dict(h5.attrs)


def test_patches_are_the_pixels(tiny_world, tmp_path):
    out = extract(cfg_for(tiny_world, tmp_path / "feats.h5"), progress=False)
    arrays, attrs = read_all(out)
    dataset = json.loads((tiny_world / "dataset.json").read_text())["images"]
    assert arrays["image_ids"].tolist() == [im["imgid"] for im in dataset]
    assert arrays["att"].shape == (len(dataset), 64, 192) and arrays["fc"].shape == (len(dataset), 192)
    assert attrs["backbone"] == "patches" and attrs["image_size"] == 64 and len(attrs["fingerprint"]) == 16
    first = np.asarray(Image.open(tiny_world / "images" / dataset[0]["filename"]), dtype=np.float32) / 255
    patch = first[8:16, 16:24].transpose(2, 0, 1).reshape(-1)  # grid row 1, column 2
    np.testing.assert_allclose(arrays["att"][0, 1 * 8 + 2].astype(np.float32), patch, atol=2e-3)
    reader = FeatureReader(out)
    np.testing.assert_array_equal(reader.get_many("fc", [dataset[3]["imgid"], dataset[1]["imgid"]]),
                                  arrays["fc"][[3, 1]])
    assert (tmp_path / "feats.config.yaml").exists()


def test_interrupted_then_resumed_equals_one_shot(tiny_world, tmp_path):
    one_shot = extract(cfg_for(tiny_world, tmp_path / "once.h5", workers=2), progress=False)

    def stop_after_two_batches(written):
        if written >= 16:
            raise KeyboardInterrupt

    cfg = cfg_for(tiny_world, tmp_path / "resumed.h5", workers=2)
    with pytest.raises(KeyboardInterrupt):
        extract(cfg, on_batch=stop_after_two_batches, progress=False)
    assert not (tmp_path / "resumed.h5").exists() and (tmp_path / "resumed.h5.partial").exists()
    with h5py.File(tmp_path / "resumed.h5.partial", "r") as h5:
        assert h5["image_ids"].shape[0] == 16
    extract(cfg, progress=False)
    a, _ = read_all(one_shot)
    b, _ = read_all(tmp_path / "resumed.h5")
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_open_clip_real_architecture_from_a_local_file(tiny_world, tmp_path):
    torch.manual_seed(0)
    model = open_clip.create_model("ViT-S-32")
    weights = tmp_path / "vit_s_32.pt"
    torch.save(model.state_dict(), weights)
    small = tmp_path / "small.json"
    images = json.loads((tiny_world / "dataset.json").read_text())["images"][:5]
    small.write_text(json.dumps({"images": images}))
    cfg = ExtractConfig(dataset=str(small), images_root=str(tiny_world), backbone="open_clip:ViT-S-32",
                        pretrained=str(weights), out=str(tmp_path / "clip.h5"), embeds_out=str(tmp_path / "emb.h5"),
                        workers=0, batch_size=4, dtype="float32")
    extract(cfg, progress=False)
    feats, attrs = read_all(tmp_path / "clip.h5")
    embeds, embed_attrs = read_all(tmp_path / "emb.h5")
    assert feats["att"].shape == (5, 49, 384) and attrs["backbone"] == "open_clip:ViT-S-32"
    assert attrs["fingerprint"] == fingerprint(model) == embed_attrs["fingerprint"]
    np.testing.assert_allclose(np.linalg.norm(embeds["image"], axis=1), 1.0, atol=1e-5)
    _, _, preprocess = open_clip.create_model_and_transforms("ViT-S-32")
    model.eval()
    with torch.no_grad():
        pixels = torch.stack([preprocess(Image.open(tiny_world / "images" / im["filename"]).convert("RGB"))
                              for im in images])
        direct = model.encode_image(pixels)
    np.testing.assert_allclose(feats["fc"], direct.numpy(), rtol=1e-4, atol=1e-4)


class NotWeights:
    """Any non-tensor object makes a file that weights_only must refuse."""


def test_unsafe_or_mismatched_weights_are_refused(tmp_path):
    torch.save({"state_dict": {"w": torch.zeros(2)}, "extra": NotWeights()}, tmp_path / "pickle.pt")
    with pytest.raises(DataError, match="cannot load weights safely: it holds Python objects besides tensors"):
        load_state_dict_file(tmp_path / "pickle.pt")
    (tmp_path / "results.pt").write_text('[{"image_id": 1}]')
    with pytest.raises(DataError, match=r"results\.pt: cannot load weights safely: not a torch or safetensors"):
        load_state_dict_file(tmp_path / "results.pt")
    torch.save({"visual.proj": torch.zeros(2), "bogus.key": torch.zeros(1)}, tmp_path / "partial.pt")
    from features.clip_models.open_clip_models import load_open_clip

    with pytest.raises(DataError, match=r"missing keys .*; unexpected keys bogus\.key"):
        load_open_clip("ViT-S-32", str(tmp_path / "partial.pt"))
    with pytest.raises(DataError, match=r"none\.safetensors: weights file not found"):
        load_open_clip("ViT-S-32", str(tmp_path / "none.safetensors"))
    with pytest.raises(ConfigError, match="neither an existing file nor an open_clip tag"):
        load_open_clip("ViT-S-32", "laion9000")


def test_a_hub_tag_that_cannot_be_fetched_names_the_weights_and_the_way_out(monkeypatch):
    """Offline, a hub tag fails inside open_clip with a RuntimeError; it reads as a named data error."""
    import open_clip

    from features.clip_models.open_clip_models import load_open_clip

    def offline(*args, pretrained=None, **kwargs):
        raise RuntimeError(f"Failed to download weights for tag '{pretrained}': Failed to download file\nmore")

    monkeypatch.setattr(open_clip, "create_model_and_transforms", offline)
    with pytest.raises(DataError, match=r"cannot fetch the open_clip weights ViT-B-32 'openai' .*--pretrained PATH"):
        load_open_clip("ViT-B-32", "openai")


def _world_copy(tiny_world, tmp_path):
    root = tmp_path / "world"
    shutil.copytree(tiny_world, root)
    return root, json.loads((root / "dataset.json").read_text())


def _cli(root, out, *extra):
    return extract_cli.main(["--dataset", str(root / "dataset.json"), "--images-root", str(root),
                             "--out", str(out), "--workers", "0", *extra])


def test_missing_unreadable_and_escaping_images(tiny_world, tmp_path, capsys):
    root, data = _world_copy(tiny_world, tmp_path)
    victim = data["images"][4]
    (root / "images" / victim["filename"]).unlink()
    assert _cli(root, tmp_path / "f.h5") == 2
    assert f"id {victim['imgid']}" in capsys.readouterr().err and not (tmp_path / "f.h5").exists()

    root, data = _world_copy(tiny_world, tmp_path / "b")
    victim = data["images"][9]
    (root / "images" / victim["filename"]).write_bytes(b"not a png")
    assert _cli(root, tmp_path / "g.h5") == 2
    assert f"image id {victim['imgid']}: cannot read" in capsys.readouterr().err
    assert not (tmp_path / "g.h5").exists()

    root, data = _world_copy(tiny_world, tmp_path / "c")
    data["images"][2]["filepath"] = "../../etc"
    (root / "dataset.json").write_text(json.dumps(data))
    assert _cli(root, tmp_path / "h.h5") == 2
    assert f"image id {data['images'][2]['imgid']}: path '../../etc/" in capsys.readouterr().err


def test_features_from_another_backbone_are_refused(tiny_world, tmp_path, capsys):
    out = tmp_path / "feats.h5"
    assert _cli(tiny_world, out) == 0
    before = out.read_bytes()
    assert _cli(tiny_world, out, "--patch", "4") == 2
    assert "holds features from another model" in capsys.readouterr().err
    assert out.read_bytes() == before
    reader = FeatureReader(out)
    with pytest.raises(DataError, match="backbone 'patches', expected 'open_clip:ViT-B-32'"):
        reader.check_backbone("open_clip:ViT-B-32")
    with pytest.raises(DataError, match="no features for 1 image"):
        reader.require([0, 10 ** 9])
    assert _cli(tiny_world, out, "--set", "batchsize=3") == 2
    assert "unknown config key 'batchsize'" in capsys.readouterr().err


def test_import_reference_npz_layout(tmp_path):
    att_dir, fc_dir = tmp_path / "cocobu_att", tmp_path / "cocobu_fc"
    att_dir.mkdir()
    fc_dir.mkdir()
    rng = np.random.default_rng(0)
    feats = {image_id: rng.normal(size=(regions, 6)).astype(np.float32)
             for image_id, regions in [(391895, 10), (522418, 36), (184613, 20)]}
    for image_id, feat in feats.items():
        np.savez(att_dir / f"{image_id}.npz", feat=feat)
        np.save(fc_dir / f"{image_id}.npy", feat.mean(axis=0) * 2)
    out = import_npz(ImportConfig(att_dir=str(att_dir), fc_dir=str(fc_dir), out=str(tmp_path / "f.h5"),
                                  dtype="float32"), progress=False)
    reader = FeatureReader(out)
    assert reader.shapes["att"] == (3, 36, 6)
    for image_id, feat in feats.items():
        mask = reader.get("att_mask", image_id)
        assert mask.sum() == len(feat)
        np.testing.assert_array_equal(reader.get("att", image_id)[: len(feat)], feat)
        np.testing.assert_allclose(reader.get("fc", image_id), feat.mean(axis=0) * 2, rtol=1e-6)
    (att_dir / "184613.npz").unlink()
    dataset = tmp_path / "d.json"
    dataset.write_text(json.dumps({"images": [
        {"cocoid": i, "split": "val", "filename": f"{i}.jpg", "sentences": [{"raw": "x"}]} for i in feats]}))
    with pytest.raises(DataError, match=r"no \.npz for 1 image id\(s\), e.g. \[184613\]"):
        import_npz(ImportConfig(att_dir=str(att_dir), dataset=str(dataset), out=str(tmp_path / "g.h5")), progress=False)


NPZ_FAULTS = {
    "another feature size": (lambda d: np.savez(d / "att" / "2.npz", feat=np.ones((3, 5))), "2.npz: feature dim 5"),
    "no regions": (lambda d: np.savez(d / "att" / "2.npz", feat=np.ones((0, 4))), "at least one region"),
    "NaN in a region": (lambda d: np.savez(d / "att" / "2.npz", feat=np.full((3, 4), np.nan)),
                        "2.npz: 12 non-finite value(s)"),
    "pooled of another size": (lambda d: np.save(d / "fc" / "2.npy", np.ones(5)), "2.npy: pooled feature size 5"),
    "pooled as a matrix": (lambda d: np.save(d / "fc" / "2.npy", np.ones((2, 4))), "2.npy: a pooled feature must"),
    "pooled as a pickle": (lambda d: np.save(d / "fc" / "2.npy", np.array([{}], dtype=object)), "2.npy: unreadable"),
}


@pytest.mark.parametrize("fault", sorted(NPZ_FAULTS))
def test_import_npz_names_the_file_at_fault_and_writes_no_features(fault, tmp_path):
    """Each fault in one image's files is a DataError naming that file, found before a feats.h5 is finished."""
    (tmp_path / "att").mkdir()
    (tmp_path / "fc").mkdir()
    for image_id in (1, 2, 3):
        np.savez(tmp_path / "att" / f"{image_id}.npz", feat=np.ones((3, 4)))
        np.save(tmp_path / "fc" / f"{image_id}.npy", np.ones(4))
    np.save(tmp_path / "fc" / "1.npy", np.ones((1, 4)))  # a [1, D] vector is one vector
    make_fault, needle = NPZ_FAULTS[fault]
    make_fault(tmp_path)
    out = tmp_path / "f.h5"
    with pytest.raises(DataError, match=re.escape(needle)):
        import_npz(ImportConfig(att_dir=str(tmp_path / "att"), fc_dir=str(tmp_path / "fc"), out=str(out)),
                   progress=False)
    assert not out.exists()
