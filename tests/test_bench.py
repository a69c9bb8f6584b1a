"""The benchmark commands run and report what they say they do (their figures are for the notes, not
asserted here)."""

from __future__ import annotations

import json

from captioner import bench


def test_the_xe_bench_times_the_reference_model(capsys):
    assert bench.main(["xe", "--repeats", "1", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bench"] == "xe" and result["parameters"] == 50_082_304  # 6 + 6 layers, d 512, d_ff 2048
    assert result["step_s"] > 0 and result["peak_mb"] > 0 and result["device"] == "cpu"
