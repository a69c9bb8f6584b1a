"""The cross-entropy losses of teacher-forced captions."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from captioner.model import targets_and_mask


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
