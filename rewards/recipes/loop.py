"""The training loop every reward-model recipe runs: streamed data under accelerate.

One or many processes (`accelerate launch -m rewards.train_clip ...`), mixed precision, gradient
accumulation, and `save_state` / `load_state` at each epoch's end so an interrupted run resumes to
the same weights. The DataLoader yields *global* batches that accelerate splits across processes
(`split_batches`), and losses see the gathered global batch (`gather_with_grad`): N processes
train like one process with the same batch. Read top to bottom: `RecipeRun.fit` is the loop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from safetensors.torch import load_model
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from features.clip_models.factory import clip_text_forward
from features.clip_models.text_batches import PrefixTree, length_groups, shared_prefix_text_forward
from plumbing.atomic import append_line, to_json, write_json
from plumbing.config import option
from plumbing.errors import ConfigError, DataError
from plumbing.locks import hold_lock, release_lock
from plumbing.optim import adamw
from plumbing.schedules import Schedule, lr_factor
from rewards.recipes.data import raise_errors
from rewards.recipes.training import param_groups, trim_log


@dataclass
class RecipeConfig:
    """What every reward-model recipe is told: its data, its output and the loop's settings."""

    dataset: str = option("", help="Karpathy-format dataset.json")
    images_root: str = option("", help="folder the dataset's image paths are relative to")
    scenes: str | None = option(None, help="the offline world's scenes.json: hard negatives and the world-foil "
                                "report at the end")
    epochs: int = option(10, help="training epochs", at_least=1)
    batch_size: int = option(128, help="images per optimizer step over all processes (the contrastive batch)",
                             at_least=2)
    accumulation_steps: int = option(1, help="batches per optimizer step", at_least=1)
    lr: float = option(1e-3, help="peak learning rate (warmup, then cosine to 0)", above=0)
    weight_decay: float = option(0.1, help="AdamW weight decay (not on gains, biases, embeddings)", at_least=0)
    warmup_steps: int = option(50, help="linear warmup steps", at_least=0)
    max_train_images: int = option(0, help="use at most this many train images (0 = all)", at_least=0)
    max_val_images: int = option(500, help="val images for the end-of-epoch report", at_least=2)
    eval_every: int = option(1, help="run the val report every N epochs of a stage and always after its last "
                             "(0 = after the last only)", at_least=0)
    seed: int = option(0, help="random seed")
    device: str = option("auto", help="auto (the GPU when present) or cpu")
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = option("auto", help="auto: bf16/fp16 on GPU, no on CPU")
    workers: int = option(2, help="image-decoding DataLoader workers", at_least=0)
    image_cache_mb: int = option(2048, help="hold each split's preprocessed images in memory when they fit in "
                                 "this many MB (per process), instead of decoding them every epoch; 0 = never",
                                 at_least=0)
    allow_outside_root: bool = option(False, help="follow image paths and symlinks that lead outside images_root")


def precision(name: str) -> str:
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "no"


class PairOutput(NamedTuple):
    image: torch.Tensor | None
    text: torch.Tensor | None
    logit_scale: torch.Tensor
    image_labels: torch.Tensor | None = None  # the image head's logits, when the pair has one


class PairEncoder(torch.nn.Module):
    """A dual encoder's two towers (and its temperature) behind one forward, so accelerate's DDP
    wrapper sees every pass; with `image_head`, a head trained beside them reads the image
    embedding in the same forward (the world CLIP's scene labels)."""

    def __init__(self, module: torch.nn.Module, encode_text: Callable[[torch.Tensor], torch.Tensor],
                 encode_shared: Callable[[torch.Tensor, PrefixTree], torch.Tensor] | None = None,
                 image_head: torch.nn.Module | None = None):
        super().__init__()
        self.module = module
        self.encode_text = encode_text
        self.encode_shared = encode_shared
        self.image_head = image_head

    @classmethod
    def of_clip(cls, model: torch.nn.Module, image_head: torch.nn.Module | None = None) -> PairEncoder:
        """An open_clip model's pair: texts that share a prefix (a caption and its hard negatives,
        `tree`) run it once where the text tower allows (features.clip_models.text_batches)."""
        return cls(model, clip_text_forward(model), shared_prefix_text_forward(model), image_head)

    def forward(self, images: torch.Tensor | None, tokens: torch.Tensor | None,
                tree: PrefixTree | None = None) -> PairOutput:
        image = self.module.encode_image(to_channels_last(images)) if images is not None else None
        text = None
        if tokens is not None and self.encode_shared is not None:
            tree = tree if tree is not None else PrefixTree.roots(len(tokens), tokens.device)
            text = self.encode_shared(tokens, tree)
        elif tokens is not None:
            text = self._texts(tokens)
        labels = self.image_head(image) if self.image_head is not None and image is not None else None
        return PairOutput(image, text, self.module.logit_scale, labels)

    def _texts(self, tokens: torch.Tensor) -> torch.Tensor:
        """Texts in groups of similar length, each trimmed to its longest: short references no longer
        pay for long captions' padding (exact: under the causal mask padding changes nothing)."""
        groups = length_groups((tokens > 0).sum(dim=1))
        chunks = [self.encode_text(tokens[rows, :longest]) for rows, longest in groups]
        out = torch.empty(len(tokens), chunks[0].shape[1], dtype=chunks[0].dtype, device=chunks[0].device)
        out[torch.cat([rows for rows, _ in groups])] = torch.cat(chunks)
        return out


def to_channels_last(images: torch.Tensor) -> torch.Tensor:
    """Image batches in channels-last memory, where oneDNN runs a ResNet tower's forward and backward
    about a fifth faster; the weights keep their own layout, so checkpoints are unchanged."""
    return images.contiguous(memory_format=torch.channels_last) if images.dim() == 4 else images


LossFn = Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict[str, float]]]


@dataclass
class Stage:
    """One pass of epochs with its own optimizer and schedule (L-CLIP distils in two)."""

    name: str
    epochs: int
    lr: float
    warmup_steps: int
    schedule: Schedule = "cosine"
    batch_size: int | None = None  # items per step over all processes (None: the recipe's batch_size)
    first_epoch: int = 0  # the data's epoch number of the stage's first epoch: a stage that goes on from another
                          # one on the same data draws that data's next epochs, not its first ones again


def check_global_batches(cfg: Any, processes: int, section: str = "") -> None:
    """Every `*batch_size` key of the recipe is a global batch, split over the processes: checked
    before the first stage, so a text-stage batch that does not divide fails at once, not minutes in."""
    if processes < 2:
        return
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if dataclasses.is_dataclass(value):  # a section (train_clip's `world`)
            check_global_batches(value, processes, f"{section}{field.name}.")
        elif field.name.endswith("batch_size") and isinstance(value, int) and value % processes:
            raise ConfigError(f"{section}{field.name} {value} must divide into {processes} processes (it is the "
                              "global batch)")


class RecipeRun:
    """One recipe's training: the accelerator, the resumable state, the log and the lock."""

    def __init__(self, cfg: RecipeConfig, out: str | Path, log_path: str | Path, progress: bool = True):
        self.cfg, self.out, self.progress = cfg, Path(out), progress
        self.state_dir = self.out.with_name(self.out.name + ".state")
        self.log_path = Path(log_path)
        self.accelerator = Accelerator(
            cpu=cfg.device == "cpu" or not torch.cuda.is_available(),
            mixed_precision=precision(cfg.mixed_precision),
            gradient_accumulation_steps=cfg.accumulation_steps,
            dataloader_config=DataLoaderConfiguration(split_batches=True, use_seedable_sampler=True),
            step_scheduler_with_optimizer=False,
        )
        check_global_batches(cfg, self.accelerator.num_processes)
        if self.accelerator.is_main_process:
            hold_lock(self.out.with_name(self.out.name + ".lock"), f"training of {self.out}")
        set_seed(cfg.seed)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def _stage_dir(self, stage: str) -> Path:
        return self.state_dir / stage

    def _epochs_done(self, stage: str) -> int:
        path = self._stage_dir(stage) / "recipe.json"
        if not path.exists():
            return 0
        try:
            done = json.loads(path.read_text())["epochs_done"]
        except (ValueError, KeyError, TypeError, OSError) as exc:
            raise DataError(f"{path}: unreadable resume state ({exc}); delete {self.state_dir} to train "
                            "this model from the start") from None
        if not isinstance(done, int) or isinstance(done, bool) or done < 0:
            raise DataError(f"{path}: 'epochs_done' must be a count, got {done!r}; delete {self.state_dir} to "
                            "train this model from the start")
        return done

    def fit(self, model: torch.nn.Module, dataset: Dataset, collate: Callable, loss_fn: LossFn, stage: Stage,
            after_step: Callable[[torch.nn.Module], None] | None = None,
            evaluate: Callable[[int], dict] | None = None) -> dict:
        """Train `model` (a PairEncoder) for the stage's epochs, resuming where a run stopped. The
        model comes back in eval mode: what a recipe then measures (its world-foil table) is what the
        saved weights score when loaded, batch norms on their running statistics."""
        cfg, acc = self.cfg, self.accelerator
        first = self._epochs_done(stage.name)
        if first >= stage.epochs:  # finished before an interruption: its weights, no training
            load_model(model, str(self._stage_dir(stage.name) / "model.safetensors"))
            return {"model": model.to(self.device).eval(), "record": {}}
        batch_size = stage.batch_size or cfg.batch_size
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=len(dataset) > batch_size,
                            num_workers=cfg.workers, collate_fn=collate, persistent_workers=cfg.workers > 0,
                            generator=torch.Generator().manual_seed(cfg.seed))
        steps = max(1, len(loader) // cfg.accumulation_steps) * stage.epochs
        optimizer = adamw(param_groups(model, cfg.weight_decay), lr=stage.lr)
        scheduler = LambdaLR(optimizer, lr_factor(stage.warmup_steps, steps, stage.schedule))
        model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
        if first:
            acc.load_state(str(self._stage_dir(stage.name)))
            if self.progress and self.is_main:
                print(f"resuming {self.out} {stage.name} after epoch {first}")
        if self.is_main:
            trim_log(self.log_path, first, stage.name)
        record: dict = {}
        for epoch in range(first, stage.epochs):
            started = time.perf_counter()
            dataset.set_epoch(stage.first_epoch + epoch)
            loader.set_epoch(stage.first_epoch + epoch)
            sums = self._epoch(model, loader, optimizer, scheduler, loss_fn, after_step, f"{stage.name} {epoch + 1}/"
                               f"{stage.epochs}")
            record = {"stage": stage.name, "epoch": epoch + 1, **sums}
            if evaluate is not None and self.is_main and self._evaluates(epoch + 1, stage.epochs):
                record.update(evaluate(epoch))
            record["seconds"] = round(time.perf_counter() - started, 2)
            self._end_epoch(stage.name, epoch + 1, record)
        model = acc.unwrap_model(model).eval()
        acc.free_memory()
        return {"model": model, "record": record}

    def _evaluates(self, epoch: int, epochs: int) -> bool:
        every = self.cfg.eval_every
        return epoch == epochs or (every > 0 and epoch % every == 0)

    def _epoch(self, model, loader, optimizer, scheduler, loss_fn: LossFn, after_step, desc: str) -> dict:
        acc = self.accelerator
        model.train()
        sums: dict[str, float] = {}
        batches = 0
        bar = tqdm(loader, desc=desc, disable=not (self.progress and acc.is_local_main_process))
        for batch in bar:
            raise_errors(batch)
            with acc.accumulate(model):
                with acc.autocast():
                    loss, parts = loss_fn(model, batch)
                if not torch.isfinite(loss):
                    from plumbing.errors import RlcapError

                    raise RlcapError(f"{self.out}: the loss is {loss.item()} at {desc}; stopping")
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if acc.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            if after_step is not None:
                after_step(acc.unwrap_model(model))
            batches += 1
            for key, value in {"train_loss": loss.item(), **parts}.items():
                sums[key] = sums.get(key, 0.0) + value
            bar.set_postfix(loss=f"{loss.item():.3f}")
        return {key: value / max(1, batches) for key, value in sums.items()}

    def _end_epoch(self, stage: str, epochs_done: int, record: dict) -> None:
        """Log first, then the state, swapped in whole: a crash between the two leaves a log line
        that the resumed run trims, never a state without its epoch count."""
        acc = self.accelerator
        final = self._stage_dir(stage)
        tmp = final.with_name(final.name + ".partial")
        if self.is_main:
            append_line(self.log_path, to_json(record))
            if self.progress:
                print(to_json(record), flush=True)
            shutil.rmtree(tmp, ignore_errors=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp))
        acc.wait_for_everyone()
        if self.is_main:
            write_json(tmp / "recipe.json", {"epochs_done": epochs_done})
            old = final.with_name(final.name + ".old")
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()

    def finish(self) -> None:
        """The outputs are written: the resume state goes, and the lock, and the process group."""
        self.accelerator.wait_for_everyone()
        if self.is_main:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            release_lock(self.out.with_name(self.out.name + ".lock"))
        self.accelerator.end_training()  # every rank takes the process group down (see captioner.train)
