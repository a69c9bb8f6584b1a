"""The per-epoch validation pass: every image of the val split decoded across processes, with the
teacher-forced loss of its references."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from captioner.decoding import Constraints, decode
from captioner.losses import per_image_loss
from captioner.train_config import EvalConfig
from captioner.vocab import Vocab


def first_per_image(tokens: torch.Tensor, images: int) -> torch.Tensor:
    """With several samples per image, the first one (the rows of an image are consecutive)."""
    return tokens.view(images, -1, tokens.shape[-1])[:, 0]


@dataclass
class SplitOutput:
    captions: dict[int, str]
    loss: float


@torch.no_grad()
def decode_split(accelerator, model, loader, vocab: Vocab, cfg: EvalConfig) -> SplitOutput:
    """Captions for every image of the loader's split, gathered from all processes."""
    net = accelerator.unwrap_model(model)
    net.eval()
    constraints = Constraints.of(cfg, vocab)
    captions: dict[int, str] = {}
    losses: list[torch.Tensor] = []
    for batch in loader:
        with accelerator.autocast():
            logits = net(batch["att"], batch["fc"], batch["att_mask"], batch["labels"])
            loss = per_image_loss(logits, batch["labels"])
            out = decode(net, batch["att"], batch["fc"], batch["att_mask"], cfg, constraints)
            tokens = first_per_image(out.tokens, len(batch["image_ids"]))
        # gather_for_metrics drops the samples that even out the last batch across processes
        ids, tokens, loss = accelerator.gather_for_metrics((batch["image_ids"], tokens, loss.float()))
        captions.update(zip(ids.tolist(), vocab.decode_batch(tokens), strict=True))
        losses.append(loss)
    return SplitOutput(captions, float(torch.cat(losses).mean()) if losses else float("nan"))
