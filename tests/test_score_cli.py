from __future__ import annotations

import json

import pytest

from plumbing.errors import ConfigError
from rewards import score
from rewards.context import ScoringContext
from rewards.suite import (
    MetricOutput,
    MetricSpec,
    MetricSuite,
    available_metrics,
    register_metric,
)

REFS = {"annotations": [
    {"image_id": 1, "caption": "A dog sits on a red mat."}, {"image_id": 1, "caption": "a dog on a mat"},
    {"image_id": 2, "caption": "Two cats sleep."}, {"image_id": 2, "caption": "cats sleeping on a sofa"},
    {"image_id": 3, "caption": "A red bus."},
], "images": [{"id": 1}, {"id": 2}, {"id": 3}]}


def write(path, obj):
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def run(tmp_path, preds, refs=REFS, *extra):
    out = tmp_path / "scores.json"
    code = score.main(["--predictions", write(tmp_path / "p.json", preds), "--references",
                       write(tmp_path / "r.json", refs), "--out", str(out), *extra])
    return code, out


def test_scores_coco_annotations_and_writes_the_file(tmp_path, capsys):
    code, out = run(tmp_path, [{"image_id": 1, "caption": "a dog on a red mat"},
                               {"image_id": 2, "caption": "two cats on a sofa"}], REFS,
                            "--metrics", "bleu_4,cider,rouge_l")
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["corpus"]) == {"bleu_4", "cider", "rouge_l"}
    assert set(result["per_item"]["cider"]) == {"1", "2"} and result["skipped"] == {}
    assert "cider" in capsys.readouterr().out


def test_a_split_on_references_without_splits_is_noted_not_silently_dropped(tmp_path, capsys):
    code, _ = run(tmp_path, [{"image_id": 1, "caption": "a dog"}], REFS, "--split", "test", "--metrics", "bleu_1")
    assert code == 0 and "has no splits (not a Karpathy dataset.json); split 'test' is not applied" in \
        capsys.readouterr().err


def test_karpathy_split_and_refs_json(tmp_path, karpathy_file):
    code, out = run(tmp_path, [{"image_id": 1002, "caption": "zebras eat grass"}],
                    json.loads(karpathy_file.read_text()), "--split", "val", "--metrics", "cider")
    assert code == 0 and "1002" in json.loads(out.read_text())["per_item"]["cider"]
    code, _ = run(tmp_path, [{"image_id": 1000, "caption": "a dog"}], json.loads(karpathy_file.read_text()),
                  "--split", "val", "--metrics", "cider")
    assert code == 2
    code, out = run(tmp_path, [{"image_id": 7, "caption": "a dog"}], {"7": ["a dog", "the dog"]}, "--metrics", "bleu_1")
    assert code == 0


@pytest.mark.parametrize("preds,needle", [
    ([{"image_id": 1, "caption": "x"}, {"image_id": 9, "caption": "y"}, {"image_id": 11, "caption": "z"}],
     "2 prediction id(s) not in the references"),
    ([{"image_id": 1, "caption": "x"}, {"image_id": 1, "caption": "y"}], "duplicate prediction for image id 1"),
    ([{"image_id": 2, "caption": ["not", "a", "string"]}], "image id 2: caption must be a string"),
    ([{"image_id": "2", "caption": "x"}], "entry 0: image_id must be an integer"),
    ({"image_id": 1}, "expected a JSON list"),
    ('[{"image_id": 1, "caption": "tr', "malformed JSON"),
])
def test_bad_predictions_are_clear_errors_and_write_nothing(tmp_path, capsys, preds, needle):
    code, out = run(tmp_path, preds)
    assert code == 2 and needle in capsys.readouterr().err
    assert not out.exists()


def test_missing_ids_are_listed(tmp_path, capsys):
    run(tmp_path, [{"image_id": 1, "caption": "x"}, {"image_id": 99, "caption": "y"}])
    assert "e.g. [99]" in capsys.readouterr().err


def test_unknown_metric_names_the_known_ones(tmp_path, capsys):
    code, out = run(tmp_path, [{"image_id": 1, "caption": "x"}], REFS, "--metrics", "cider,blue_4")
    err = capsys.readouterr().err
    assert code == 2 and "unknown metric 'blue_4'" in err and "bleu_4" in err and not out.exists()


def test_spice_and_cider_d_are_skipped_with_reasons(tmp_path):
    code, out = run(tmp_path, [{"image_id": 1, "caption": "a dog"}], REFS, "--metrics", "cider_d,spice,cider")
    skipped = json.loads(out.read_text())["skipped"]
    assert code == 0 and "cider_d" in skipped and "--cider-df" in skipped["cider_d"]
    assert "spice" in skipped and ("CoreNLP" in skipped["spice"] or "Java" in skipped["spice"])


def test_a_new_metric_family_joins_the_registry_unchanged():
    class Length:
        def compute(self, data):
            values = [float(len(c.split())) for c in data.candidates]
            return MetricOutput({"test_words": sum(values) / len(values)}, {"test_words": values})

    register_metric(MetricSpec(("test_words",), lambda ctx: Length(), in_all=False))
    assert "test_words" in available_metrics()
    out = MetricSuite(["test_words", "cider"], ScoringContext()).score({5: "a b c"}, {5: ["a b"]})
    assert out.per_item["test_words"] == {5: 3.0} and "cider" in out.corpus
    with pytest.raises(ConfigError, match="unknown metric 'nope'"):
        MetricSuite(["nope"])


def test_cider_d_from_prepro_document_frequencies(tiny_world, tmp_path):
    from captioner import prepro

    prepro.main(["--dataset", str(tiny_world / "dataset.json"), "--out", str(tmp_path / "data"), "--min-count", "1"])
    data = json.loads((tiny_world / "dataset.json").read_text())["images"]
    val = [im for im in data if im["split"] == "val"]
    preds = [{"image_id": im["imgid"], "caption": im["sentences"][0]["raw"]} for im in val]
    refs = {str(im["imgid"]): [s["raw"] for s in im["sentences"][1:]] for im in val}
    df = str(tmp_path / "data" / "cider_df.json.gz")
    code, out = run(tmp_path, preds, refs, "--metrics", "cider_d", "--cider-df", df)
    plain = json.loads(out.read_text())["corpus"]["cider_d"]
    code_eos, out = run(tmp_path, preds, refs, "--metrics", "cider_d", "--cider-df", df, "--cider-eos")
    with_eos = json.loads(out.read_text())["corpus"]["cider_d"]
    assert code == code_eos == 0 and plain > 0 and with_eos > 0 and plain != with_eos
