"""Contrastive objectives and retrieval recall for dual encoders."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """The global batch of a per-process tensor, rows in process order, gradients flowing back to
    every process's rows. Every process then computes the same global loss; with DDP averaging
    the gradients, N processes train exactly like one process with the global batch."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x.contiguous()))


def distill_loss(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """L-CLIP's Eq. (1): ½·mean|r_T − r_S| + ½·(1 − cos(r_T, r_S)), averaged over the batch."""
    return 0.5 * (teacher - student).abs().mean() + 0.5 * (1 - F.cosine_similarity(teacher, student, dim=-1)).mean()


def embedding_spectrum(embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (ascending, rounding's negatives set to 0) and eigenvectors (columns) of the
    covariance of the normalised `embeddings` ([N, d]), in float64: where a set of embeddings varies,
    and how much."""
    unit = F.normalize(embeddings.double(), dim=-1)
    values, vectors = torch.linalg.eigh(torch.cov(unit.T))
    return values.clamp_min(0), vectors


def info_nce(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """Symmetric CLIP loss on normalised embeddings; row i of each is a matching pair."""
    logits = logit_scale.exp() * image @ text.t()
    target = torch.arange(len(image), device=image.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


def negclip_loss(image: torch.Tensor, text: torch.Tensor, mask: torch.Tensor, logit_scale: torch.Tensor,
                 caption_ids: torch.Tensor | None = None, image_negatives: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """CLIP loss with hard text negatives (NegCLIP): image [B, d], text [B, T, d] normalised with
    text[:, 0] the image's caption and text[:, 1:] captions false of it (mask [B, T] marks real
    texts). Image->text ranks every caption and every hard negative of the batch; text->image ranks
    the images for each caption (a negative describes no image, so it has no row of its own).

    `caption_ids` [B] marks rows whose captions are the same text: such a caption is true of both
    images, so neither counts as the other's negative (else the loss asks for the impossible).
    `image_negatives` [N, d] are pictures that no caption of the batch is true of (each one
    edits a fact its own image's caption states): text->image also ranks every caption against
    them."""
    captions = text[:, 0]
    negatives = text[:, 1:][mask[:, 1:]]
    scale = logit_scale.exp()
    target = torch.arange(len(image), device=image.device)
    image_to_text = scale * image @ torch.cat([captions, negatives]).t()
    text_to_image = scale * captions @ image.t()
    if image_negatives is not None and len(image_negatives):
        text_to_image = torch.cat([text_to_image, scale * captions @ image_negatives.t()], dim=1)
    if caption_ids is not None:
        twins = (caption_ids[:, None] == caption_ids[None, :]) & ~torch.eye(len(image), dtype=torch.bool,
                                                                              device=image.device)
        text_to_image = torch.cat([text_to_image[:, : len(image)].masked_fill(twins, float("-inf")),
                                   text_to_image[:, len(image):]], dim=1)
        image_to_text = torch.cat([image_to_text[:, : len(image)].masked_fill(twins, float("-inf")),
                                   image_to_text[:, len(image):]], dim=1)
    return (F.cross_entropy(image_to_text, target) + F.cross_entropy(text_to_image, target)) / 2


def recall_at_1(image: torch.Tensor, text: torch.Tensor) -> dict[str, float]:
    """Image→text and text→image R@1 for N matching pairs (chance = 1/N)."""
    similarity = image @ text.t()
    target = torch.arange(len(image), device=image.device)
    return {
        "i2t_r1": float((similarity.argmax(1) == target).float().mean()),
        "t2i_r1": float((similarity.argmax(0) == target).float().mean()),
        "chance": 1.0 / len(image),
    }


CHUNK = 256  # rows per forward when embedding a whole split


@torch.no_grad()
def embed_texts(encode, tokenizer, texts: list[str], device: torch.device) -> torch.Tensor:
    """Normalised embeddings of texts (row i = texts[i]), run shortest first in chunks trimmed to their
    longest sequence: a chunk of short references no longer pads to a long caption's length."""
    ids = tokenizer.ids(texts)
    order = sorted(range(len(ids)), key=lambda row: len(ids[row]))
    chunks = [F.normalize(encode(tokenizer.padded([ids[row] for row in order[i: i + CHUNK]]).to(device)).float(),
                          dim=-1) for i in range(0, len(order), CHUNK)]
    embedded = torch.cat(chunks)
    out = torch.empty_like(embedded)
    out[torch.tensor(order, device=embedded.device)] = embedded
    return out
