"""Sweeps over seeds: run folders per α and seed, resuming, means with 95% intervals (scipy), the α
chosen by its mean over seeds, paired comparisons across seeds, selection regret, and bad seed lists."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from captioner import select as select_cli
from captioner import sweep as sweep_cli
from captioner.seeded_select import seeded_groups
from captioner.selection_regret import selection_regret
from captioner.train_config import TrainConfig
from plumbing.config import load_config
from plumbing.intervals import mean_interval
from tests.captioner_fixtures import tiny_sweep

ALPHAS, SEEDS = [0.0, 1.0], [3, 4]


@pytest.fixture(scope="module")
def seeded(tiny_world, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("seeded")
    sweep, folder = tiny_sweep(tiny_world, root, 1, ["cider", "cider_d", "bleu_4", "object_recall",
                                                     "hallucination_mention"], alphas=ALPHAS, seeds=SEEDS)
    assert sweep_cli.main(["--config", str(sweep), "--no-progress"]) == 0
    return {"root": root, "sweep": sweep, "dir": folder}


def test_seeds_times_alphas_give_one_run_folder_each(seeded):
    runs = sorted(p.name for p in seeded["dir"].iterdir() if (p / "metrics.jsonl").exists())
    assert runs == ["alpha_0_seed_3", "alpha_0_seed_4", "alpha_1_seed_3", "alpha_1_seed_4"]
    for alpha in ALPHAS:
        for seed in SEEDS:
            cfg = load_config(TrainConfig, seeded["dir"] / f"alpha_{alpha:g}_seed_{seed}" / "config.yaml")
            assert cfg.run.seed == seed and cfg.scst.rewards == {"bleu_4": alpha, "cider_d": 1.0 - alpha}
    first, second = ([json.loads(line) for line in (seeded["dir"] / f"alpha_0_seed_{s}" / "metrics.jsonl")
                      .read_text().splitlines()] for s in SEEDS)
    assert first[0]["train_loss"] != second[0]["train_loss"]  # the seed reaches the run


def test_resuming_skips_finished_runs(seeded, capsys):
    capsys.readouterr()
    assert sweep_cli.main(["--config", str(seeded["sweep"]), "--no-progress"]) == 0
    assert capsys.readouterr().out.count("finished earlier") == 4


def test_summary_gives_each_alphas_mean_and_interval_over_seeds(seeded):
    rows = list(csv.DictReader((seeded["dir"] / "summary.csv").open()))
    for alpha in ALPHAS:
        values = [float(r["cider"]) for r in rows if r["alpha"] == str(alpha) and r["statistic"] == "value"]
        stats = {r["statistic"]: float(r["cider"]) for r in rows if r["alpha"] == str(alpha) and not r["seed"]}
        expected = mean_interval(values)
        assert len(values) == 2 and stats["mean"] == pytest.approx(expected.mean)
        assert stats["low"] == pytest.approx(expected.low) and stats["high"] == pytest.approx(expected.high)
    markdown = (seeded["dir"] / "summary.md").read_text()
    assert "mean over its seeds and the 95% interval" in markdown and "| 0 |" in markdown
    assert (seeded["dir"] / "alpha_metrics.png").read_bytes()[:4] == b"\x89PNG"


def test_the_interval_is_scipys_students_t():
    from scipy import stats

    sample = [0.71, 0.74, 0.78]
    got = mean_interval(sample)
    expected = stats.ttest_1samp(sample, 0.0).confidence_interval(0.95)
    assert (got.low, got.high) == pytest.approx((expected.low, expected.high), abs=1e-12)
    four = mean_interval([1.0, 2.0, 3.0, 4.0])  # sem 0.6455, t(0.975, 3) = 3.1824
    assert (four.mean, four.low, four.high) == pytest.approx((2.5, 0.4457, 4.5543), abs=1e-4)
    assert mean_interval([2.0]).text() == "2.0000"


def _fake_run(folder: Path, records: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("{}")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture()
def hand_made(tmp_path) -> Path:
    """α 0 has the single best run (seed 0: CIDEr 1.0) but the lower mean (0.6); α 1 the higher (0.65)."""
    cider = {(0, 0): [0.5, 1.0], (0, 1): [0.2, 0.1], (1, 0): [0.7, 0.6], (1, 1): [0.4, 0.6]}
    halluc = {(0, 0): [0.3, 0.2], (0, 1): [0.5, 0.6], (1, 0): [0.1, 0.25], (1, 1): [0.4, 0.3]}
    for (alpha, seed), values in cider.items():
        _fake_run(tmp_path / f"alpha_{alpha}_seed_{seed}", [
            {"epoch": e, "cider": c, "specs": 0.7 + 0.01 * e + 0.001 * alpha, "hallucination_mention": h,
             "clip_s": 1.0 + c} for e, (c, h) in enumerate(zip(values, halluc[alpha, seed], strict=True))])
    return tmp_path


def test_selection_by_mean_over_seeds_picks_the_right_alpha(hand_made, capsys):
    assert select_cli.main(["--sweep", str(hand_made), "--by", "cider"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["alpha"] == 1.0 and result["mean"] == pytest.approx(0.65)
    assert [(r["seed"], r["epoch"]) for r in result["runs"]] == [(0, 0), (1, 1)]  # each seed's own best epoch
    assert "selection regret" in out


def test_selection_regret_counts_hits_and_shortfalls(hand_made):
    rows = {(r.selector, r.target): r for r in selection_regret(seeded_groups(hand_made, "cider", None))}
    # specs picks epoch 1 of α 1 in each seed: CIDEr 0.6 (best 1.0) and 0.6 (best 0.6)
    specs_cider = rows["specs", "cider"]
    assert (specs_cider.hits, specs_cider.seeds) == (1, 2) and specs_cider.mean == pytest.approx(0.2)
    # hallucination of those picks: 0.25 (least 0.1) and 0.3 (least 0.3)
    specs_halluc = rows["specs", "hallucination_mention"]
    assert specs_halluc.hits == 1 and specs_halluc.worst == pytest.approx(0.15)
    assert rows["cider", "cider"].mean == 0.0 and rows["clip_s", "cider"].hits == 2


def test_paired_across_seeds_against_alpha_0(seeded, capsys):
    """Per-image CIDEr averaged over seeds: its mean difference equals the difference of the logged means."""
    capsys.readouterr()
    assert select_cli.main(["--sweep", str(seeded["dir"]), "--by", "cider", "--paired", "--against", "0"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    rows = {r["metric"]: r for r in result["paired"]}
    assert set(rows) >= {"cider", "object_recall", "hallucination_mention"} and "specs" not in rows  # no model
    logged = {}
    for alpha in ALPHAS:
        for seed in SEEDS:
            records = [json.loads(line) for line in (seeded["dir"] / f"alpha_{alpha:g}_seed_{seed}" /
                                                     "metrics.jsonl").read_text().splitlines()]
            logged[alpha, seed] = max(records, key=lambda r: r["cider"])["cider"]
    expected = sum(logged[1.0, s] - logged[0.0, s] for s in SEEDS) / len(SEEDS)
    cider = rows["cider"]
    assert cider["alpha"] == 1.0 and cider["reference"] == 0.0 and cider["seeds"] == 2
    assert cider["difference"] == pytest.approx(expected, abs=1e-9)
    assert cider["seed_difference"] == pytest.approx(expected, abs=1e-9)
    assert cider["image_low"] <= cider["difference"] <= cider["image_high"]
    assert "each α against α = 0 over 2 seeds" in out
    assert select_cli.main(["--sweep", str(seeded["dir"]), "--by", "cider", "--paired", "--against", "0.4"]) == 2
    assert "the sweep has no α 0.4" in capsys.readouterr().err


@pytest.mark.parametrize("seeds,needle", [("[]", "'seeds' is empty"), ("[1, 2, 1]", "'seeds' repeats a value")])
def test_bad_seed_lists_are_config_errors_naming_the_key(seeded, capsys, seeds, needle):
    assert sweep_cli.main(["--config", str(seeded["sweep"]), "--set", f"seeds={seeds}"]) == 2
    assert needle in capsys.readouterr().err


def test_a_sweep_folder_with_runs_of_another_seed_list_is_refused(seeded, capsys):
    assert sweep_cli.main(["--config", str(seeded["sweep"]), "--set", "seeds=[3]"]) == 2
    err = capsys.readouterr().err
    assert "holds runs from another seed list (alpha_0_seed_4, alpha_1_seed_4)" in err
    assert sweep_cli.main(["--config", str(seeded["sweep"]), "--set", "seeds=null"]) == 2
    assert "alpha_0_seed_3" in capsys.readouterr().err


def test_a_sweep_runs_seed_by_seed_so_a_cut_sweep_holds_whole_replicates():
    cfg = sweep_cli.SweepConfig(alphas=[0.0, 0.5, 1.0], seeds=[3, 4])
    assert sweep_cli.sweep_points(cfg) == [(0.0, 3), (0.5, 3), (1.0, 3), (0.0, 4), (0.5, 4), (1.0, 4)]
    assert sweep_cli.sweep_points(sweep_cli.SweepConfig(alphas=[0.0, 1.0])) == [(0.0, None), (1.0, None)]
