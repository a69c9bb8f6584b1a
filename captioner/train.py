"""`python -m captioner.train --config configs/xe_world.yaml [--set k=v] [--resume latest]`

Trains the captioner with cross-entropy under accelerate (`accelerate launch -m
captioner.train ...` for several processes or GPUs). Every epoch decodes the val split, scores
it with the metric suite, appends one line to runs/<name>/metrics.jsonl, writes
samples/epoch_<k>.json and saves checkpoints/epoch_<k> (plus `last` and `best`). `--resume
latest` continues an interrupted run exactly where it stopped.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.checkpoint import (
    TrainerState,
    check_state_files,
    config_differences,
    finished_epochs,
    load_weights,
    read_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from captioner.data import CaptionDataset, Labels, collate
from captioner.losses import caption_loss
from captioner.model import Captioner
from captioner.run_log import RunLog, read_metrics
from captioner.scst import check_scst_config, policy_dropout_off, sample_table, scst_scalars, scst_step
from captioner.select import metric_mode
from captioner.train_config import TrainConfig, scoring_context
from captioner.validation import decode_split
from captioner.vocab import Vocab
from features.store import FeatureReader
from plumbing.atomic import to_json, write_text
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import dump_config, to_dict
from plumbing.errors import ConfigError, DataError, RlcapError
from plumbing.locks import hold_lock, release_lock
from plumbing.optim import adamw
from plumbing.schedules import lr_factor
from plumbing.tables import format_table
from rewards import MetricSuite, RewardBank


def mixed_precision(name: str) -> str:
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "no"


def build_model(cfg: TrainConfig, state: TrainerState) -> Captioner:
    return Captioner(cfg.model, state.vocab_size, state.max_len, state.feat_dim, state.n_tokens, state.fc_dim)


def data_shapes(cfg: TrainConfig, labels: Labels, vocab: Vocab) -> TrainerState:
    feats = FeatureReader(cfg.data.feats)
    feats.require(labels.image_ids.tolist(), what=f"the dataset of {cfg.data.labels}")
    if int(labels.labels.max()) > len(vocab):
        raise DataError(f"{cfg.data.labels} uses word ids up to {int(labels.labels.max())} but {cfg.data.vocab} "
                        f"has {len(vocab)} words: they come from different prepro runs")
    if cfg.model.visual_stem == "patch_conv" and feats.attrs.get("backbone") != "patches":
        raise ConfigError(f"model.visual_stem 'patch_conv' needs `patches` features; {cfg.data.feats} holds "
                          f"{feats.attrs.get('backbone')!r}")
    _, n_tokens, feat_dim = feats.shapes["att"]
    return TrainerState(feat_dim=int(feat_dim), n_tokens=int(n_tokens), fc_dim=int(feats.shapes["fc"][1]),
                        max_len=labels.max_len, vocab_size=len(vocab), feats_backbone=str(feats.attrs.get("backbone")),
                        feats_fingerprint=str(feats.attrs.get("fingerprint", "")),
                        feats_image_size=int(feats.attrs.get("image_size", 0)), feats_dtype=feats.dtypes["att"],
                        stage=cfg.train.stage)


def check_resume(ckpt: Path, cfg: TrainConfig, vocab: Vocab, shapes: TrainerState) -> TrainerState:
    state, saved_cfg, saved_vocab = read_checkpoint(ckpt)
    diffs = config_differences(saved_cfg.get("model", {}), to_dict(cfg.model), "model.")
    if diffs:
        raise ConfigError(f"cannot resume {ckpt}: the model config differs: {'; '.join(diffs)}")
    if saved_vocab != vocab:
        raise DataError(f"cannot resume {ckpt}: its vocabulary differs from {cfg.data.vocab}: "
                        f"{saved_vocab.differences(vocab)}")
    for key in ("feat_dim", "n_tokens", "fc_dim", "max_len"):
        if getattr(state, key) != getattr(shapes, key):
            raise DataError(f"cannot resume {ckpt}: {key} is {getattr(state, key)} there, {getattr(shapes, key)} "
                            f"in {cfg.data.feats} / {cfg.data.labels}")
    return state


def load_training_state(accelerator: Accelerator, checkpoint: Path) -> None:
    from safetensors import SafetensorError

    try:
        accelerator.load_state(str(checkpoint))
    except (SafetensorError, EOFError, RuntimeError) as exc:
        raise DataError(f"cannot resume from {checkpoint}: a state file is corrupt or truncated ({exc}); "
                        "resume from an earlier checkpoint (--resume DIR) instead") from None


def check_selection(cfg: TrainConfig, suite: MetricSuite) -> None:
    """eval.select_by must be a metric this run computes (or val_loss), with a direction."""
    computed = [n for n in suite.names if n not in suite.skipped] + ["val_loss"]
    if cfg.eval.select_by not in computed:
        why = f" ({suite.skipped[cfg.eval.select_by]})" if cfg.eval.select_by in suite.skipped else ""
        raise ConfigError(f"eval.select_by {cfg.eval.select_by!r} is not among the metrics this run computes{why}: "
                          f"{', '.join(computed)}; add it to eval.metrics or select by another")
    metric_mode(cfg.eval.select_by, cfg.eval.select_mode)


def check_fresh_start(run_dir: Path, checkpoint: Path | None) -> None:
    """A run that starts from scratch must not overwrite a run that is already there."""
    if checkpoint is not None:
        return
    logged = len(read_metrics(run_dir))
    if logged or (run_dir / "checkpoints" / "last").exists():
        raise ConfigError(f"{run_dir} already holds a run ({logged} epoch(s) logged); continue it with --resume auto "
                          "(or latest), or give this one another run.name")


def uses_scst(cfg: TrainConfig) -> bool:
    return cfg.train.stage == "scst" or cfg.train.scst_from_epoch >= 0


def stage_of(cfg: TrainConfig, epoch: int) -> str:
    if cfg.train.stage == "scst" or 0 <= cfg.train.scst_from_epoch <= epoch:
        return "scst"
    return "xe"


def reference_policy(cfg: TrainConfig, state: TrainerState, vocab: Vocab, device: torch.device) -> Captioner | None:
    """The frozen starting policy the KL penalty keeps SCST close to (scst.init_from's weights)."""
    if not (uses_scst(cfg) and cfg.scst.kl_coef):
        return None
    if not cfg.scst.init_from:
        raise ConfigError("scst.kl_coef needs scst.init_from: the checkpoint whose policy the KL is measured to")
    reference = build_model(cfg, state)
    init_weights(reference, cfg.scst.init_from, vocab)
    return reference.to(device).eval().requires_grad_(False)


def init_weights(model: Captioner, checkpoint: str, vocab: Vocab) -> None:
    """Start from another run's weights (SCST from an XE checkpoint)."""
    path = Path(checkpoint)
    _, _, saved_vocab = read_checkpoint(path)
    if saved_vocab != vocab:
        raise DataError(f"scst.init_from {path}: its vocabulary differs from the data's: "
                        f"{saved_vocab.differences(vocab)}")
    load_weights(model, path, "scst.init_from")


def make_loaders(cfg: TrainConfig, labels: Labels) -> tuple[DataLoader, DataLoader, CaptionDataset]:
    train_ds = CaptionDataset(labels, cfg.data.feats, "train", cfg.data.seq_per_img, cfg.run.seed)
    val_ds = CaptionDataset(labels, cfg.data.feats, cfg.data.val_split, cfg.data.seq_per_img, cfg.run.seed)
    if cfg.data.max_val_images:
        val_ds.rows = val_ds.rows[: cfg.data.max_val_images]
    kw = {"collate_fn": collate, "num_workers": cfg.data.workers}
    train = DataLoader(train_ds, batch_size=cfg.data.batch_size, shuffle=True, drop_last=True, **kw)
    val = DataLoader(val_ds, batch_size=cfg.eval.batch_size, shuffle=False, **kw)
    return train, val, train_ds


def _isolated_rng_iter(loader):
    """Iterate a loader without letting it consume the global torch RNG.

    Starting a DataLoader iterator draws a base seed from the global generator, and accelerate's
    loaders start it lazily at the first batch. A resumed run starts its iterator at a different
    point than the original did, so that draw would shift every later dropout mask; holding the
    RNG state across the first fetch keeps resumed runs bit-identical.
    """
    state = torch.get_rng_state()
    batches = iter(loader)
    first = next(batches, None)
    torch.set_rng_state(state)
    if first is not None:
        yield first
        yield from batches


class Trainer:
    """Holds what one run needs; `fit` is the loop, read top to bottom."""

    def __init__(self, cfg: TrainConfig, resume: str | None = None, progress: bool = True,
                 without_rng_state: bool = False):
        self.cfg, self.progress = cfg, progress
        self.run_dir = Path(cfg.run.out_dir) / cfg.run.name
        self.accelerator = Accelerator(
            # Without CUDA, ask for CPU explicitly so that torchrun-style launches become MULTI_CPU (gloo).
            cpu=not torch.cuda.is_available(),
            mixed_precision=mixed_precision(cfg.train.mixed_precision),
            gradient_accumulation_steps=cfg.optim.accumulation_steps,
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
            # The schedule counts optimizer steps, however many processes share a step.
            step_scheduler_with_optimizer=False,
        )
        if self.accelerator.is_main_process:  # one process per run folder, before anything in it is read
            hold_lock(self.run_dir / ".lock", f"run {self.run_dir}")
        set_seed(cfg.run.seed)  # before the model is built: same init on every process
        self.labels = Labels.load(cfg.data.labels)
        self.vocab = Vocab.load(cfg.data.vocab)
        shapes = data_shapes(cfg, self.labels, self.vocab)
        if resume == "auto":  # continue when the run has a checkpoint, else start fresh
            resume = "latest" if (self.run_dir / "checkpoints" / "last").exists() else None
        ckpt = resolve_checkpoint(self.run_dir, resume) if resume else None
        self.state = check_resume(ckpt, cfg, self.vocab, shapes) if ckpt else shapes
        # one scoring context per process: references, CIDEr df and the CLIP-family models, shared
        # by the reward bank and the metric suite
        self.scoring = scoring_context(cfg, str(self.accelerator.device))
        self.refs = self.scoring.references
        train_loader, val_loader, self.train_ds = make_loaders(cfg, self.labels)
        model = build_model(cfg, self.state)
        if cfg.scst.init_from and not ckpt:
            init_weights(model, cfg.scst.init_from, self.vocab)
        self.bank = None
        if uses_scst(cfg):
            check_scst_config(cfg.scst)
            self.bank = RewardBank.from_config(cfg.scst.rewards, self.scoring, cfg.scst.normalize)
            self.bank.normalizer.load_state_dict(self.state.reward_stats)
        self.reference = reference_policy(cfg, self.state, self.vocab, self.accelerator.device)
        optimizer = adamw(model.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                         weight_decay=cfg.optim.weight_decay)
        self.steps_per_epoch = self._steps_per_epoch(len(train_loader))
        total = self.steps_per_epoch * cfg.train.epochs
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(
            cfg.optim.warmup_steps, total, cfg.optim.schedule, cfg.optim.min_lr_ratio))
        self.model, self.optimizer, self.train_loader, self.val_loader, self.scheduler = self.accelerator.prepare(
            model, optimizer, train_loader, val_loader, scheduler)
        # None, or why this run's draws are no longer reproducible: kept in its first epoch's record
        self.resume_note = None
        if ckpt:
            self.resume_note = check_state_files(ckpt, self.accelerator.process_index, without_rng_state)
            if self.resume_note and self.accelerator.is_main_process:
                print(f"warning: {self.resume_note}", file=sys.stderr, flush=True)
            load_training_state(self.accelerator, ckpt)
        self.suite = MetricSuite(cfg.eval.metrics, self.scoring) if self.accelerator.is_main_process else None
        if self.suite is not None:
            check_selection(cfg, self.suite)
            check_fresh_start(self.run_dir, ckpt)
        # Everything is checked: only from here on is anything in the run folder written.
        self.log = RunLog(self.run_dir, self.accelerator.is_main_process)
        if self.accelerator.is_main_process:
            dump_config(cfg, self.run_dir / "config.yaml")
            self._drop_metrics_after(self.state.epoch)

    def _keep_reward_stats(self) -> None:
        """running_z statistics go into the checkpoint, so a resumed run normalises as before."""
        if self.bank is not None:
            self.state.reward_stats = self.bank.normalizer.state_dict()

    def _steps_per_epoch(self, batches: int) -> int:
        processes = self.accelerator.num_processes
        per_process = batches // processes if batches >= processes else batches
        if self.cfg.train.max_steps_per_epoch:
            per_process = min(per_process, self.cfg.train.max_steps_per_epoch)
        return max(1, per_process // self.cfg.optim.accumulation_steps)

    def _drop_metrics_after(self, epoch: int) -> None:
        """A resumed run re-logs the epochs it redoes; keep metrics.jsonl free of duplicates."""
        records = [r for r in read_metrics(self.run_dir) if r["epoch"] < epoch]
        write_text(self.run_dir / "metrics.jsonl", "".join(to_json(r) + "\n" for r in records))

    def fit(self) -> TrainerState:
        for epoch in range(self.state.epoch, self.cfg.train.epochs):
            start = time.perf_counter()
            train_loss = self.train_epoch(epoch)
            metrics = self.evaluate(epoch)
            self.end_epoch(epoch, train_loss, metrics, time.perf_counter() - start)
        self.log.close()
        if self.suite is not None:
            self.suite.close()
            release_lock(self.run_dir / ".lock")
        # the process group goes down with every rank here: left to the interpreter's exit, gloo's
        # threads can abort a finished rank (SIGABRT) and the launcher then reports the run failed
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()
        return self.state

    def train_epoch(self, epoch: int) -> float:
        cfg, acc = self.cfg, self.accelerator
        # the captioner's only train/eval difference is dropout (GroupNorm, no BatchNorm)
        self.model.train(not (stage_of(cfg, epoch) == "scst" and policy_dropout_off(cfg.scst)))
        self.train_ds.set_epoch(epoch)
        self.train_loader.set_epoch(epoch)
        skip = self.state.step_in_epoch if epoch == self.state.epoch else 0
        loader = acc.skip_first_batches(self.train_loader, skip) if skip else self.train_loader
        batches = _isolated_rng_iter(loader)
        limit = self.steps_per_epoch * cfg.optim.accumulation_steps
        self.state.stage = stage_of(cfg, epoch)
        bar = tqdm(total=limit, initial=skip, desc=f"epoch {epoch} {self.state.stage}", unit="batch",
                   disable=not (self.progress and acc.is_local_main_process))
        # batches of this epoch done before an interruption still count in its logged train_loss
        self.carried = (self.state.loss_sum, self.state.loss_batches) if skip else (0.0, 0)
        losses = []
        for index in range(skip, limit):
            batch = next(batches, None)
            if batch is None:
                break
            with acc.accumulate(self.model):
                with acc.autocast():
                    loss = self._loss(batch)
                if not torch.isfinite(loss):
                    raise RlcapError(f"epoch {epoch} batch {index}: the loss is {loss.item()}; stopping")
                acc.backward(loss)
                if acc.sync_gradients and cfg.optim.grad_clip > 0:
                    acc.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
                self.optimizer.step()
                if acc.sync_gradients:
                    self.scheduler.step()
                self.optimizer.zero_grad()
            losses.append(loss.item())
            bar.update(1)
            if acc.sync_gradients:
                self._after_step(epoch, index + 1, losses)
        bar.close()
        total, count = self._pooled_loss(losses)
        return total / max(1, count)

    def _pooled_loss(self, losses: list[float]) -> tuple[float, int]:
        """Sum and count of this epoch's batch losses over all processes, the carried part included."""
        local = torch.tensor([sum(losses), len(losses)], dtype=torch.float64, device=self.accelerator.device)
        pooled = self.accelerator.reduce(local, reduction="sum")
        return self.carried[0] + float(pooled[0]), self.carried[1] + int(pooled[1])

    def _loss(self, batch: dict) -> torch.Tensor:
        if self.state.stage == "xe":
            logits = self.model(batch["att"], batch["fc"], batch["att_mask"], batch["labels"])
            return caption_loss(logits, batch["labels"], self.cfg.optim.label_smoothing)
        net = self.accelerator.unwrap_model(self.model)
        self.scst = scst_step(self.model, net, batch, self.bank, self.vocab, self.cfg.scst, self.reference)
        self.scst_ids = batch["image_ids"].tolist()
        return self.scst.loss

    def _after_step(self, epoch: int, consumed: int, losses: list[float]) -> None:
        self.state.global_step += 1
        step = self.state.global_step
        if step % self.cfg.train.log_every == 0:
            bar_loss = sum(losses[-self.cfg.train.log_every:]) / min(len(losses), self.cfg.train.log_every)
            self.log.scalars({"train/loss": bar_loss, "train/lr": self.scheduler.get_last_lr()[0]}, step)
            if self.state.stage == "scst":
                self.log.scalars(scst_scalars(self.accelerator, self.scst, self.cfg.scst.k), step)
        if self.state.stage == "scst" and step % self.cfg.scst.sample_table_every == 0:
            header, rows = sample_table(self.scst, self.scst_ids, self.cfg.scst.k)
            self.log.text("train/samples", format_table(header, rows, markdown=True), step)
        every = self.cfg.checkpoint.every_steps
        if every and step % every == 0:
            self.state.epoch, self.state.step_in_epoch = epoch, consumed
            self.state.loss_sum, self.state.loss_batches = self._pooled_loss(losses)
            self._keep_reward_stats()
            save_checkpoint(self.accelerator, self.run_dir, f"step_{step}", self.state, self.cfg, self.vocab,
                            False, self.cfg.checkpoint.keep_last)

    def evaluate(self, epoch: int) -> dict[str, float]:
        out = decode_split(self.accelerator, self.model, self.val_loader, self.vocab, self.cfg.eval)
        self.val_captions = out.captions
        metrics = {"val_loss": out.loss}
        self.skipped: dict[str, str] = {}
        if self.suite is not None:
            result = self.suite.score(out.captions, self.refs)
            metrics.update(result.corpus)
            self.skipped = {k: v for k, v in result.skipped.items() if k not in self.suite.skipped}
            if self.skipped:
                print(f"epoch {epoch}: skipped {self.skipped}", flush=True)
        return metrics

    def end_epoch(self, epoch: int, train_loss: float, metrics: dict[str, float], seconds: float) -> None:
        cfg = self.cfg
        score = metrics.get(cfg.eval.select_by)
        is_best = False
        if self.accelerator.is_main_process and score is None:
            # checked at the start, so it failed this epoch (e.g. METEOR's Java process): no best here
            print(f"epoch {epoch}: {cfg.eval.select_by} could not be computed ({self.skipped.get(cfg.eval.select_by)});"
                  " this epoch cannot become the best checkpoint", flush=True)
        elif self.accelerator.is_main_process:
            better = (lambda a, b: a > b) if metric_mode(cfg.eval.select_by, cfg.eval.select_mode) == "max" \
                else (lambda a, b: a < b)
            is_best = self.state.best_score is None or better(score, self.state.best_score)
        is_best = bool(self.accelerator.gather(torch.tensor([is_best], device=self.accelerator.device))[0])
        if is_best and score is not None:
            self.state.best_score, self.state.best_epoch = score, epoch
        record = {"epoch": epoch, "stage": self.state.stage, "step": self.state.global_step, "train_loss": train_loss,
                  **metrics, "seconds": round(seconds, 1)}
        if self.resume_note:
            record["resume_note"], self.resume_note = self.resume_note, None
        self.log.scalars({f"val/{k}": v for k, v in metrics.items()}, self.state.global_step)
        self.log.text("samples", self._sample_table(), self.state.global_step)
        self.log.samples(epoch, self.val_captions)
        self.log.epoch(record)
        if self.accelerator.is_main_process:
            shown = {k: round(v, 4) for k, v in record.items() if isinstance(v, float)}
            print(f"epoch {epoch}: {shown}", flush=True)
        self.state.epoch, self.state.step_in_epoch = epoch + 1, 0
        self.state.loss_sum, self.state.loss_batches = 0.0, 0
        self._keep_reward_stats()
        save_checkpoint(self.accelerator, self.run_dir, f"epoch_{epoch}", self.state, cfg, self.vocab, is_best,
                        cfg.checkpoint.keep_last)

    def _sample_table(self) -> str:
        rows = []
        for image_id in list(self.val_captions)[: self.cfg.eval.show_samples]:
            rows.append([str(image_id), self.val_captions[image_id], (self.refs.get(image_id) or [""])[0]])
        return format_table(["image", "caption", "a reference"], rows, markdown=True)


def build_parser() -> argparse.ArgumentParser:
    parser = config_parser(TrainConfig, "python -m captioner.train", __doc__)
    parser.add_argument("--resume", help="'latest' (this run's last checkpoint), 'auto' (latest if there is one, "
                        "else start) or a checkpoint directory")
    parser.add_argument("--resume-without-rng-state", action="store_true",
                        help="resume even when the checkpoint's RNG state is missing, corrupt or refused by the safe "
                        "loader: the run goes on from a fresh random state (not reproducible) and its next "
                        "metrics.jsonl record says so")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs and CI)")
    return parser


@command
def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_config(TrainConfig, build_parser(), argv)
    for key in ("labels", "vocab", "refs", "feats"):
        if not getattr(cfg.data, key):
            raise ConfigError(f"config key 'data.{key}' is required")
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    if args.resume == "auto" and finished_epochs(run_dir) >= cfg.train.epochs:
        named = [*cfg.eval.metrics, "val_loss"]
        if cfg.eval.select_by not in named:  # the same refusal a run that trains would give, without its models
            raise ConfigError(f"eval.select_by {cfg.eval.select_by!r} is not among the metrics this run computes: "
                              f"{', '.join(named)}; add it to eval.metrics or select by another")
        print(f"{run_dir} finished earlier ({finished_epochs(run_dir)} epochs of {cfg.train.epochs}); nothing to do "
              "(raise train.epochs to go on)")
        return 0
    trainer = Trainer(cfg, args.resume, progress=not args.no_progress,
                      without_rng_state=args.resume_without_rng_state)
    state = trainer.fit()
    if trainer.accelerator.is_main_process:
        print(f"done: best {cfg.eval.select_by} {state.best_score} at epoch {state.best_epoch}; "
              f"run in {Path(cfg.run.out_dir) / cfg.run.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
