"""`captioner.compare`: runs side by side at their last or best epoch, under the start they share."""

from __future__ import annotations

import json
from pathlib import Path

from captioner import compare


def _run(root: Path, name: str, epochs: list[dict], start: dict | None = None) -> Path:
    run = root / name
    run.mkdir()
    lines = [json.dumps({"epoch": k, "stage": "scst", "train_loss": 1.0, **rec}) for k, rec in enumerate(epochs)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if start is not None:
        (run / "start.json").write_text(json.dumps({**start, "captions": {"1": "a cat"}}))
    return run


def test_rows_are_the_start_then_each_run_at_its_chosen_epoch(tmp_path, capsys):
    a = _run(tmp_path, "a", [{"cider": 1.1, "specs": 0.70}, {"cider": 1.3, "specs": 0.69}],
             start={"cider": 1.0, "specs": 0.68, "checkpoint": "xe/best"})
    b = _run(tmp_path, "b", [{"cider": 0.9, "specs": 0.72, "grammar": 0.5}])
    assert compare.main(["--runs", f"{a},{b}", "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| run | cider | specs |"  # grammar: not every row holds it
    assert lines[2:] == ["| start | 1.0000 | 0.6800 |", "| a (epoch 1) | 1.3000 | 0.6900 |",
                         "| b (epoch 0) | 0.9000 | 0.7200 |"]
    assert compare.main(["--runs", str(a), "--runs", str(b), "--epoch", "best", "--by", "specs",
                         "--metrics", "specs,grammar"]) == 0
    out = capsys.readouterr().out
    assert "a (epoch 0)" in out and "0.7000" in out and "0.5000" in out


def test_bad_runs_and_metrics_are_named(tmp_path, capsys):
    a = _run(tmp_path, "a", [{"cider": 1.0}])
    empty = _run(tmp_path, "empty", [])
    (empty / "metrics.jsonl").write_text("")
    assert compare.main(["--runs", str(tmp_path / "missing")]) == 2
    assert "missing: not a run folder (no metrics.jsonl)" in capsys.readouterr().err
    assert compare.main(["--runs", f"{a},{empty}"]) == 2
    assert "empty: no finished epoch" in capsys.readouterr().err
    assert compare.main(["--runs", str(a), "--metrics", "spice"]) == 2
    assert "no run holds ['spice']" in capsys.readouterr().err
