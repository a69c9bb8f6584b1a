"""Decoding a split, the teacher-forced loss on it, and scoring with the metric suite."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from captioner.decoding import beam_search, greedy
from captioner.model import targets_and_mask
from captioner.train_config import EvalConfig
from captioner.vocab import Vocab


def caption_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean over captions of each caption's mean token NLL (EOS included).

    Normalising per caption, not per token, keeps the loss of a global batch equal to the mean
    of the per-process losses, so N processes train exactly like one with the same global batch.
    """
    return per_image_loss(logits, labels, label_smoothing).mean()


def per_image_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """[B] mean over each image's captions of their mean token NLL."""
    targets, mask = targets_and_mask(labels.reshape(-1, labels.shape[-1]))
    nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none", label_smoothing=label_smoothing)
    per_caption = (nll * mask).sum(1) / mask.sum(1)
    return per_caption.view(labels.shape[0], -1).mean(1)


@dataclass
class SplitOutput:
    captions: dict[int, str]
    loss: float


@torch.no_grad()
def decode_split(accelerator, model, loader, vocab: Vocab, cfg: EvalConfig) -> SplitOutput:
    """Captions for every image of the loader's split, gathered from all processes."""
    net = accelerator.unwrap_model(model)
    net.eval()
    captions: dict[int, str] = {}
    losses: list[torch.Tensor] = []
    for batch in loader:
        with accelerator.autocast():
            logits = net(batch["att"], batch["fc"], batch["att_mask"], batch["labels"])
            loss = per_image_loss(logits, batch["labels"])
            if cfg.decode == "beam":
                out = beam_search(net, batch["att"], batch["fc"], batch["att_mask"], cfg.beam_size, cfg.length_penalty)
            else:
                out = greedy(net, batch["att"], batch["fc"], batch["att_mask"])
        # gather_for_metrics drops the samples that even out the last batch across processes
        ids, tokens, loss = accelerator.gather_for_metrics((batch["image_ids"], out.tokens, loss.float()))
        captions.update(zip(ids.tolist(), vocab.decode_batch(tokens), strict=True))
        losses.append(loss)
    return SplitOutput(captions, float(torch.cat(losses).mean()) if losses else float("nan"))
