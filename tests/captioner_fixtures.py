"""A prepared tiny world (prepro + patches features) and tiny training configs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from captioner import prepro
from features.extract import ExtractConfig, extract

ROOT = Path(__file__).resolve().parents[1]


def prepare_tiny_data(world: Path, out: Path) -> dict[str, str]:
    prepro.main(["--dataset", str(world / "dataset.json"), "--out", str(out / "data"), "--min-count", "1",
                 "--max-len", "12"])
    extract(ExtractConfig(dataset=str(world / "dataset.json"), images_root=str(world), out=str(out / "feats.h5"),
                          workers=0), progress=False)
    return {"labels": str(out / "data" / "labels.h5"), "vocab": str(out / "data" / "vocab.json"),
            "refs": str(out / "data" / "refs.json"), "feats": str(out / "feats.h5"),
            "cider_df": str(out / "data" / "cider_df.json.gz"), "scenes": str(world / "scenes.json")}


def tiny_config(paths: dict[str, str], out_dir: Path, name: str = "tiny", **sections) -> Path:
    cfg = {
        "run": {"name": name, "out_dir": str(out_dir), "seed": 3},
        "data": {**paths, "seq_per_img": 2, "batch_size": 8, "workers": 0},
        "model": {"d_model": 32, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 64, "dropout": 0.1,
                  "visual_stem": "patch_conv", "stem_channels": [8, 16]},
        "optim": {"lr": 3e-3, "warmup_steps": 2},
        "train": {"epochs": 2, "log_every": 2},
        "eval": {"metrics": ["bleu_4", "cider", "object_recall", "hallucination_mention"], "batch_size": 16},
        "checkpoint": {"keep_last": 2},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    path = out_dir / f"{name}.yaml"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def launch_two_processes(config: Path, module: str = "captioner.train", *args: str) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu --num_processes 2 -m MODULE` on CPU (torchrun + gloo)."""
    accelerate = shutil.which("accelerate") or str(Path(sys.executable).parent / "accelerate")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    extra = ["--no-progress"] if module == "captioner.train" else []
    return subprocess.run([accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", module,
                           "--config", str(config), *extra, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def tiny_sweep(world: Path, root: Path, epochs: int, metrics: list[str], **sweep: object) -> tuple[Path, Path]:
    """A tiny XE start, an SCST base config from it and a sweep config of bleu_4 against cider_d over it
    (`sweep` adds or replaces the sweep's keys); returns the sweep config and the sweep's folder."""
    data = prepare_tiny_data(world, root)
    xe = tiny_config(data, root, name="xe", train={"epochs": 1})
    from captioner import train

    assert train.main(["--config", str(xe), "--no-progress"]) == 0
    base = tiny_config(data, root, name="scst_base", train={"epochs": epochs, "stage": "scst", "log_every": 1},
                       optim={"lr": 1e-4, "warmup_steps": 0},
                       scst={"rewards": {"cider_d": 1.0}, "k": 3,
                             "init_from": str(root / "xe" / "checkpoints" / "last")},
                       eval={"metrics": metrics, "select_by": "cider"})
    config = root / "sweep.yaml"
    config.write_text(yaml.safe_dump({"name": "sw", "out_dir": str(root / "sweeps"), "base": str(base),
                                      "reward_a": "bleu_4", "reward_b": "cider_d", "select_by": "cider", **sweep}))
    return config, root / "sweeps" / "sw"
