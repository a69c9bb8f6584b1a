"""`python -m captioner.coco [run|rehearse]`: the whole COCO run, step by step, with configs/coco/.

`run` takes the Karpathy file, the image root and the weights (files or open_clip hub tags) and runs
every step in order: prepro, features (bottom-up regions when their folders are given, CLIP RN50
grid), the reward models' image embeddings, XE, SCST (new self-critical and classic), the CLIP-family
mix, the α sweep, selection by SPECS, the test split with beam 5 and its scores. Each step is the
command a user would type with the step's config under configs/coco/ and `--set` for the paths; a
finished step is skipped by the command itself and an interrupted one resumes, so re-running this
continues where it stopped. At the end it prints where each output is and what to run next.

`rehearse` needs no network and no COCO: it builds a COCO-shaped set (real COCO captions, generated
images at COCO's sizes, bottom-up-style features) and reward models at their real sizes in their real
file layouts with random weights (features.coco_rehearsal), then runs every step with the unchanged
configs, only epoch, step, image and run counts cut by --set.
"""

from __future__ import annotations

import importlib
import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from plumbing.atomic import write_text
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option
from plumbing.errors import ConfigError, RlcapError

CONFIGS = Path("configs/coco")
# rehearse: counts cut so that the whole run fits a CI job on two CPU cores; shapes stay the configs'
TRAIN_CUTS = ["train.epochs=1", "train.max_steps_per_epoch=1", "data.max_val_images=4", "data.workers=0",
              "checkpoint.keep_last=1"]
EXTRACT_CUTS = ["workers=0", "batch_size=16"]
SWEEP_CUTS = ["alphas=[0.0, 1.0]", "seeds=[0]", "launcher=inprocess"]


@dataclass
class CocoConfig:
    mode: Literal["run", "rehearse"] = option("run", help="run: your COCO; rehearse: offline, random weights at "
                                              "the real sizes, counts cut", positional=True)
    dataset: str = option("data/coco/dataset_coco.json", help="Karpathy's dataset_coco.json")
    images: str = option("data/coco/images", help="the folder dataset_coco.json's filepath/filename are under")
    bottomup_att: str | None = option(None, help="bottom-up region features, <id>.npz (route 1; skipped without)")
    bottomup_fc: str | None = option(None, help="their pooled features, <id>.npy")
    grid_weights: str = option("openai", help="the CLIP RN50 grid backbone's weights: a file or an open_clip hub tag")
    clip_weights: str = option("openai", help="CLIP-S's ViT-B/32 weights: a file or an open_clip hub tag")
    clip_arch: str = option("ViT-B-32", help="CLIP-S's open_clip architecture (ViT-B-32-quickgelu for OpenAI's "
                            "weights as a file)")
    spec: str = option("data/coco/weights/spec.pt", help="SPECS's released LongCLIP-B spec.pt")
    lclip: str = option("data/coco/weights/lclip.ckpt", help="an L-CLIP (DistillCLIP) checkpoint")
    features: Literal["bottomup", "clip_rn50"] = option("bottomup", help="the features the captioner trains on")
    out: str = option("runs/coco", help="where every output goes (rehearse: runs/coco_rehearsal by default)")
    rehearsal_images: int = option(200, help="rehearse: images of the COCO sample to use", at_least=40, at_most=200)
    inputs: str | None = option(None, help="rehearse: where the stand-in set and models are built and kept "
                                "(default: <out>/inputs)")
    progress: bool = option(True, help="progress bars inside the steps")
    only: list[str] = option(factory=list, help="run only these steps (prepro, bottomup, grid, embeds_clip, "
                             "embeds_specs, embeds_lclip, xe, scst_nsc, scst_cider_greedy, scst_clip_mix, sweep, "
                             "select, evaluate, score); default every step")


@dataclass
class Step:
    key: str  # its name for --only
    name: str
    module: str
    argv: list[str]
    output: str

    def shown(self) -> str:
        return " ".join(["python -m", self.module, *map(shlex.quote, self.argv)])


def _sets(pairs: dict[str, object], cuts: Sequence[str] = ()) -> list[str]:
    return [word for item in [*(f"{k}={v}" for k, v in pairs.items()), *cuts] for word in ("--set", item)]


def steps(cfg: CocoConfig, rehearse: bool = False) -> list[Step]:
    """Every step's command, in order; `rehearse` adds the counts' cuts."""
    train_cuts, extract_cuts = (TRAIN_CUTS, EXTRACT_CUTS) if rehearse else ([], [])
    out = Path(cfg.out)
    data, feats, embeds, runs, sweeps = out / "data", out / "feats", out / "embeds", out / "runs", out / "sweeps"
    train_data = {"data.labels": data / "labels.h5", "data.vocab": data / "vocab.json", "data.refs": data / "refs.json",
                  "data.cider_df": data / "cider_df.json.gz", "data.feats": feats / f"{cfg.features}.h5"}
    models = {"reward_models.clip.arch": cfg.clip_arch, "reward_models.clip.weights": cfg.clip_weights,
              "reward_models.clip.embeds": embeds / "clip.h5", "reward_models.specs.weights": cfg.spec,
              "reward_models.specs.embeds": embeds / "specs.h5", "reward_models.lclip.weights": cfg.lclip,
              "reward_models.lclip.embeds": embeds / "lclip.h5"}
    start = {"scst.init_from": runs / "coco_xe" / "checkpoints" / "best"}
    images = {"dataset": cfg.dataset, "images_root": cfg.images}
    quiet = [] if cfg.progress else ["--no-progress"]
    plan = [Step("prepro", "prepro", "captioner.prepro", ["--config", str(CONFIGS / "prepro.yaml"),
                                                *_sets({"dataset": cfg.dataset, "out": data})], str(data))]
    if cfg.bottomup_att:
        fc = {"fc_dir": cfg.bottomup_fc} if cfg.bottomup_fc else {"fc_dir": "null"}
        plan.append(Step("bottomup", "features: bottom-up regions", "features.import_npz", [
            "--config", str(CONFIGS / "features_bottomup.yaml"),
            *_sets({"att_dir": cfg.bottomup_att, **fc, "dataset": cfg.dataset, "out": feats / "bottomup.h5"})],
            str(feats / "bottomup.h5")))
    plan.append(Step("grid", "features: CLIP RN50 grid", "features.extract", [
        "--config", str(CONFIGS / "features_clip_rn50.yaml"),
        *_sets({**images, "pretrained": cfg.grid_weights, "out": feats / "clip_rn50.h5"}, extract_cuts)],
        str(feats / "clip_rn50.h5")))
    for key, weights in (("clip", cfg.clip_weights), ("specs", cfg.spec), ("lclip", cfg.lclip)):
        backbone = {"backbone": f"open_clip:{cfg.clip_arch}"} if key == "clip" else {}
        plan.append(Step(f"embeds_{key}", f"image embeddings: {key}", "features.extract", [
            "--config", str(CONFIGS / f"embeds_{key}.yaml"),
            *_sets({**images, **backbone, "pretrained": weights, "embeds_out": embeds / f"{key}.h5"}, extract_cuts)],
            str(embeds / f"{key}.h5")))
    for name, config, extra in (("XE", "xe", {}), ("SCST, new self-critical", "scst_nsc", start),
                                ("SCST, greedy baseline", "scst_cider_greedy", start),
                                ("SCST, CIDEr-D + CLIP-S, SPECS selects", "scst_clip_mix", {**start, **models})):
        run = "coco_xe" if config == "xe" else f"coco_{config}"
        plan.append(Step(config, name, "captioner.train", [
            "--config", str(CONFIGS / f"{config}.yaml"),
            *_sets({**train_data, "run.out_dir": runs, **extra}, train_cuts), "--resume", "auto", *quiet],
            str(runs / run)))
    overrides = [f"{k}={v}" for k, v in {**train_data, **start, **models}.items()] + list(train_cuts)
    plan.append(Step("sweep", "α sweep", "captioner.sweep", [
        "--config", str(CONFIGS / "sweep_alpha.yaml"),
        *_sets({"out_dir": sweeps, "overrides": json.dumps(overrides)}, SWEEP_CUTS if rehearse else []), *quiet],
        str(sweeps / "alpha")))
    plan.append(Step("select", "selection by SPECS", "captioner.select", [
        "--sweep", str(sweeps / "alpha"), "--paired", "--against", "0"], str(sweeps / "alpha" / "summary.md")))
    results, scores = out / "test_clip_mix.json", out / "test_clip_mix.scores.json"
    plan.append(Step("evaluate", "test split, beam 5", "captioner.evaluate", [
        "--checkpoint", str(runs / "coco_scst_clip_mix" / "checkpoints" / "best"), "--split", "test", "--beam", "5",
        "--out", str(results)], str(results)))
    plan.append(Step("score", "test scores with the three reward models", "rewards.score", [
        "--config", str(CONFIGS / "scoring.yaml"), *_sets({"cider_df": data / "cider_df.json.gz", **models}),
        "--predictions", str(results), "--references", cfg.dataset, "--split", "test", "--out", str(scores)],
        str(scores)))
    return plan


def run_steps(plan: Sequence[Step]) -> list[float]:
    """Each step in this process, in order; a failed one stops the run, naming it and its command."""
    seconds = []
    for index, step in enumerate(plan, 1):
        print(f"\n[coco] {index}/{len(plan)} {step.name}: {step.shown()}", flush=True)
        start = time.perf_counter()
        code = importlib.import_module(step.module).main(step.argv)
        seconds.append(time.perf_counter() - start)
        if code != 0:
            raise RlcapError(f"step {index}/{len(plan)} ({step.name}) failed (exit {code}); its message is above. "
                             f"Fix it and re-run this command: finished steps are skipped. The step alone: "
                             f"{step.shown()}")
    return seconds


def rehearsal_inputs(cfg: CocoConfig) -> Path:
    return Path(cfg.inputs) if cfg.inputs else Path(cfg.out) / "inputs"


def with_rehearsal_inputs(cfg: CocoConfig) -> CocoConfig:
    """The run's inputs pointed at the rehearsal set (built or not)."""
    from features.coco_rehearsal import RehearsalSet

    made = RehearsalSet(rehearsal_inputs(cfg))
    cfg.dataset, cfg.images = str(made.dataset), str(made.images)
    cfg.bottomup_att, cfg.bottomup_fc = str(made.bottomup_att), str(made.bottomup_fc)
    cfg.grid_weights = str(made.weights("rn50.safetensors"))
    cfg.clip_weights = str(made.weights("vit_b_32.safetensors"))
    cfg.spec, cfg.lclip, cfg.clip_arch = str(made.weights("spec.pt")), str(made.weights("lclip.ckpt")), "ViT-B-32"
    return cfg


def prepare(cfg: CocoConfig) -> CocoConfig:
    """rehearse: the offline set and models; run: the inputs checked before hours of work."""
    if cfg.mode == "rehearse":
        from features.coco_rehearsal import build_rehearsal_set

        if cfg.out == "runs/coco":
            cfg.out = "runs/coco_rehearsal"
        build_rehearsal_set(rehearsal_inputs(cfg), cfg.rehearsal_images)
        return with_rehearsal_inputs(cfg)
    for key in ("dataset", "images", "spec", "lclip"):
        if not Path(getattr(cfg, key)).exists():
            raise ConfigError(f"--{key.replace('_', '-')} {getattr(cfg, key)}: not found (docs/coco.md, 'What you "
                              "bring')")
    if cfg.features == "bottomup" and not cfg.bottomup_att:
        raise ConfigError("--features bottomup needs --bottomup-att (the <id>.npz folder); or train on the CLIP "
                          "grid with --features clip_rn50")
    return cfg


def report(cfg: CocoConfig, plan: Sequence[Step], seconds: Sequence[float]) -> None:
    print("\n[coco] done; where each output is (seconds this time):")
    for step, taken in zip(plan, seconds, strict=True):
        print(f"  {step.name:45s} {taken:7.1f}  {step.output}")
    out = Path(cfg.out)
    print("[coco] next: the report of the CIDEr-D + CLIP-S run, chosen by SPECS:\n"
          f"  python -m captioner.report --run {out / 'runs' / 'coco_scst_clip_mix'} --by specs")
    if cfg.mode == "rehearse":
        print("[coco] this was the rehearsal (random weights, counts cut); on COCO: python -m captioner.coco run "
              "--dataset ... --images ... (docs/coco.md)")


def chosen(plan: list[Step], only: Sequence[str]) -> list[Step]:
    if not only:
        return plan
    keys = [step.key for step in plan]
    unknown = [key for key in only if key not in keys]
    if unknown:
        raise ConfigError(f"--only {unknown[0]!r}: not a step of this run; its steps: {', '.join(keys)}")
    return [step for step in plan if step.key in only]


def write_scoring(cfg: CocoConfig) -> Path:
    """The run's scoring config with every path resolved: `rewards.score`, `rewards.meta_eval` and
    `captioner.bench scst --scoring` read the run's reward models from it."""
    out = Path(cfg.out)
    reward_models = {
        "clip": {"kind": "open_clip", "arch": cfg.clip_arch, "weights": cfg.clip_weights,
                 "embeds": str(out / "embeds" / "clip.h5")},
        "specs": {"kind": "longclip", "weights": cfg.spec, "embeds": str(out / "embeds" / "specs.h5")},
        "lclip": {"kind": "lclip", "weights": cfg.lclip, "embeds": str(out / "embeds" / "lclip.h5")}}
    path = out / "scoring.yaml"
    write_text(path, yaml.safe_dump({"cider_df": str(out / "data" / "cider_df.json.gz"),
                                     "reward_models": reward_models}, sort_keys=False))
    return path


@command
def main(argv: Sequence[str] | None = None) -> int:
    cfg, _ = parse_config(CocoConfig, config_parser(CocoConfig, "python -m captioner.coco", __doc__), argv)
    cfg = prepare(cfg)
    plan = chosen(steps(cfg, rehearse=cfg.mode == "rehearse"), cfg.only)
    scoring = write_scoring(cfg)
    report(cfg, plan, run_steps(plan))
    print(f"[coco] the run's reward models, for the scoring commands and the benches: {scoring}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
