from __future__ import annotations

import json

import h5py
import pytest

from captioner import prepro
from plumbing.ptb import ptb_tokenize
from rewards.text.cider_df import load_df


def decode(labels_row, ix_to_word):
    return [ix_to_word[str(i)] for i in labels_row if i != 0]


def test_karpathy_fixture_round_trips(karpathy_file, tmp_path):
    out = tmp_path / "prepro"
    assert prepro.main(["--dataset", str(karpathy_file), "--out", str(out), "--min-count", "1", "--max-len", "6"]) == 0
    vocab = json.loads((out / "vocab.json").read_text())
    ix_to_word = vocab["ix_to_word"]
    dataset = json.loads(karpathy_file.read_text())
    with h5py.File(out / "labels.h5", "r") as h5:
        assert h5["image_ids"][:].tolist() == [1000, 1001, 1002, 1003]  # cocoid wins over imgid
        assert [s.decode() for s in h5["split"][:]] == ["train", "train", "val", "test"]  # restval -> train
        starts, ends = h5["label_start_ix"][:], h5["label_end_ix"][:]
        labels, lengths = h5["labels"][:], h5["label_length"][:]
        for k, image in enumerate(dataset["images"]):
            rows = range(starts[k] - 1, ends[k])  # 1-based inclusive, as the reference codebase
            assert len(rows) == len(image["sentences"])
            for row, sent in zip(rows, image["sentences"], strict=True):
                known = set(ix_to_word.values())
                expected = [w if w in known else "UNK" for w in ptb_tokenize(sent["raw"]).split()[:6]]
                assert decode(labels[row], ix_to_word) == expected
                assert lengths[row] == len(expected)
    assert "UNK" in ix_to_word.values()  # val/test words never enter the vocabulary
    assert "ca" in ix_to_word.values() and "n't" in ix_to_word.values()  # PTB-style contractions
    refs = json.loads((out / "refs.json").read_text())
    assert refs["1002"] == [s["raw"] for s in dataset["images"][2]["sentences"]]
    assert (out / "prepro_config.yaml").exists()


def test_unk_and_document_frequencies(karpathy_file, tmp_path):
    out = tmp_path / "p"
    prepro.main(["--dataset", str(karpathy_file), "--out", str(out), "--min-count", "2"])
    words = set(json.loads((out / "vocab.json").read_text())["ix_to_word"].values())
    assert "UNK" in words and "zebras" not in words  # zebras is only in val
    df, n_docs = load_df(out / "cider_df.json.gz", use_eos=False)
    assert n_docs == 2  # train + restval images, one document each
    assert df[("dog",)] == 1 and df[("bus",)] == 1 and df[("a",)] == 2
    assert ("zebras",) not in df
    df_eos, _ = load_df(out / "cider_df.json.gz", use_eos=True)
    assert df_eos[("<eos>",)] == 2 and len(df_eos) > len(df)


def _write(path, text):
    path.write_text(text)
    return path


BAD_DATASETS = {
    "truncated": ('{"images": [{"imgid": 1, "split": "train", "filename": "a.png", "sentences": [{"raw": "a',
                  "truncated"),
    "malformed": ('{"images": [}', "malformed JSON at line 1"),
    "not_karpathy": ('[1, 2, 3]', "'images' list"),
    "duplicate": (('{"images": [{"imgid": 1, "split": "train", "filename": "a.png", "sentences": [{"raw": "x"}]},'
                  '{"imgid": 1, "split": "val", "filename": "b.png", "sentences": [{"raw": "y"}]}]}'),
                  "duplicate image id 1"),
    "no_sentences": ('{"images": [{"cocoid": 42, "split": "train", "filename": "a.png", "sentences": []}]}',
                     "image id 42: has no sentences"),
    "bad_split": ('{"images": [{"imgid": 3, "split": "dev", "filename": "a.png", "sentences": [{"raw": "x"}]}]}',
                  "image id 3: 'split'"),
    "no_id": ('{"images": [{"split": "train", "filename": "a.png", "sentences": [{"raw": "x"}]}]}',
              "images[0]: needs an integer"),
    "no_train": ('{"images": [{"imgid": 1, "split": "val", "filename": "a.png", "sentences": [{"raw": "a dog"}]}]}',
                 "no image has split 'train'"),
    "rare_words": ('{"images": [{"imgid": 1, "split": "train", "filename": "a.png", "sentences": [{"raw": "a dog"}]}]}',
                   "no train word is seen min_count=5 times (the most frequent: 'a' 1, 'dog' 1)"),
}


@pytest.mark.parametrize("name", sorted(BAD_DATASETS))
def test_bad_dataset_is_a_clear_error_and_writes_nothing(name, tmp_path, capsys):
    text, needle = BAD_DATASETS[name]
    path = _write(tmp_path / f"{name}.json", text)
    out = tmp_path / "out"
    assert prepro.main(["--dataset", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(path) in err
    assert not out.exists() or not any(out.iterdir())


def test_missing_dataset_and_config_typo(tmp_path, capsys):
    assert prepro.main(["--dataset", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o")]) == 2
    assert "nope.json: file not found" in capsys.readouterr().err
    assert prepro.main(["--dataset", "x", "--out", "y", "--set", "min_cout=3"]) == 2
    assert "unknown config key 'min_cout'" in capsys.readouterr().err
