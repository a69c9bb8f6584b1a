"""Self-critical sequence training: K samples per image, rewards from the bank, a baseline,
and a token-level policy-gradient loss masked after EOS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from captioner.decoding import Decoded, greedy
from captioner.losses import caption_loss
from captioner.vocab import Vocab
from plumbing.config import option
from plumbing.errors import ConfigError
from rewards import Normalize, RewardBank, RewardOutput


@dataclass
class ScstConfig:
    rewards: dict[str, float] = option(factory=lambda: {"cider_d": 1.0}, help="the reward mix: {name: weight}")
    k: int = option(5, help="samples per image", at_least=1)
    baseline: Literal["loo", "greedy", "none"] = option("loo", help="loo: mean of the other K-1 samples")
    scale_by_std: bool = option(False, help="divide advantages by the per-image std of rewards")
    entropy_bonus: float = option(0.0, help="weight of the sample entropy added to the objective", at_least=0)
    temperature: float = option(1.0, help="sampling temperature", above=0)
    top_k: int = option(0, help="sample from the k most likely words (0 = all)", at_least=0)
    memory_mode: bool = option(False, help="sample without gradients, then one teacher-forced pass for log-probs")
    cider_eos: bool = option(False, help="cider_d counts EOS as a word (the reference codebase does)")
    init_from: str | None = option(None, help="checkpoint directory whose weights start SCST (usually XE's best)")
    kl_coef: float = option(0.0, help="weight of the per-token KL to the init_from policy (TRL's beta)", at_least=0)
    xe_weight: float = option(0.0, help="weight of a cross-entropy anchor on the reference captions", at_least=0)
    normalize: Normalize = option("none", help="per-reward normalisation before mixing: none, batch_z or running_z")
    disable_dropout: bool | None = option(
        None, help="train the SCST policy without dropout (TRL's disable_dropout); default: when kl_coef > 0, so "
        "the KL compares the policy with its frozen start like for like and is 0 before the first update")
    sample_table_every: int = option(100, help="steps between logged tables of samples", at_least=1)


def check_scst_config(cfg: ScstConfig) -> None:
    if cfg.baseline == "loo" and cfg.k < 2:
        raise ConfigError(f"scst.baseline 'loo' needs scst.k >= 2 (the mean of the other samples); got k={cfg.k}")
    if cfg.k < 1:
        raise ConfigError("scst.k must be >= 1")


def policy_dropout_off(cfg: ScstConfig) -> bool:
    return cfg.kl_coef > 0 if cfg.disable_dropout is None else cfg.disable_dropout


def loo_baseline(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """Mean of the other K-1 samples of the same image (rows grouped by image)."""
    groups = rewards.view(-1, k)
    return ((groups.sum(1, keepdim=True) - groups) / (k - 1)).reshape(-1)


@dataclass
class ScstStep:
    loss: torch.Tensor
    rewards: RewardOutput
    advantage: torch.Tensor
    baseline: torch.Tensor
    captions: list[str]
    entropy: torch.Tensor  # mean per-token entropy of the samples
    lengths: torch.Tensor
    kl: torch.Tensor | None = None  # mean per-token KL to the reference policy (when kl_coef > 0)
    xe: torch.Tensor | None = None  # the cross-entropy anchor (when xe_weight > 0)


def alive_mask(tokens: torch.Tensor) -> torch.Tensor:
    """[N, T] True up to and including each sequence's EOS."""
    return torch.cat([torch.ones_like(tokens[:, :1], dtype=torch.bool), tokens[:, :-1] > 0], dim=1)


def token_logprobs(model, batch: dict, tokens: torch.Tensor, k: int, temperature: float) -> torch.Tensor:
    """[N, T] log-probs of the given sampled tokens under `model`, teacher-forced in one pass."""
    b = batch["att"].shape[0]
    logits = model(batch["att"], batch["fc"], batch["att_mask"], labels=tokens.view(b, k, -1))[:, :-1]
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(2, tokens[:, :, None])[:, :, 0]


def kl_to_reference(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean per-token KL(policy || reference) on the sampled tokens, by the k3 estimator
    exp(r - p) - (r - p) - 1 (non-negative, 0 where the policies agree), as TRL's GRPO."""
    delta = ref_logprobs - logprobs
    per_token = torch.exp(delta) - delta - 1
    return (per_token * mask).sum() / mask.sum()


def policy_outputs(model, net, batch: dict, cfg: ScstConfig) -> Decoded:
    """Samples with differentiable log-probs (and entropies). `model` may be a DDP wrapper of `net`."""
    args = (batch["att"], batch["fc"], batch["att_mask"])
    if not cfg.memory_mode:
        return model(*args, sample_k=cfg.k, temperature=cfg.temperature, top_k=cfg.top_k)
    with torch.no_grad():
        drawn = net(*args, sample_k=cfg.k, temperature=cfg.temperature, top_k=cfg.top_k)
    b = batch["att"].shape[0]
    logits = model(*args, labels=drawn.tokens.view(b, cfg.k, -1))[:, :-1].float() / cfg.temperature
    logp = F.log_softmax(logits, dim=-1)
    alive = alive_mask(drawn.tokens)
    token_lp = logp.gather(2, drawn.tokens[:, :, None])[:, :, 0] * alive
    entropy = -(logp.exp() * logp).sum(-1) * alive
    return Decoded(drawn.tokens, token_lp, entropy)


def scst_step(model, net, batch: dict, bank: RewardBank, vocab: Vocab, cfg: ScstConfig,
              reference=None) -> ScstStep:
    """One SCST loss: rewards of K samples per image against a baseline; with a `reference` model
    (the frozen start) and kl_coef, plus the KL to it; with xe_weight, plus XE on the references."""
    out = policy_outputs(model, net, batch, cfg)
    captions = vocab.decode_batch(out.tokens)
    ids = batch["image_ids"].repeat_interleave(cfg.k).tolist()
    scored = bank(captions, ids)
    reward = scored.total.to(out.logprobs.device)
    baseline = _baseline(net, batch, bank, vocab, cfg, reward)
    advantage = reward - baseline
    if cfg.scale_by_std:
        advantage = advantage / (reward.view(-1, cfg.k).std(1, keepdim=True).expand(-1, cfg.k).reshape(-1) + 1e-6)
    mask = alive_mask(out.tokens).float()
    loss = -(advantage.detach()[:, None] * out.logprobs * mask).sum() / mask.sum()
    entropy = (out.entropy * mask).sum() / mask.sum()
    if cfg.entropy_bonus:
        loss = loss - cfg.entropy_bonus * entropy
    kl = xe = None
    if cfg.kl_coef and reference is not None:
        with torch.no_grad():
            ref_logprobs = token_logprobs(reference, batch, out.tokens, cfg.k, cfg.temperature)
        kl = kl_to_reference(out.logprobs, ref_logprobs, mask)
        loss = loss + cfg.kl_coef * kl
    if cfg.xe_weight:
        xe = caption_loss(model(batch["att"], batch["fc"], batch["att_mask"], batch["labels"]), batch["labels"])
        loss = loss + cfg.xe_weight * xe
    return ScstStep(loss, scored, advantage.detach(), baseline.detach(), captions, entropy.detach(),
                    out.lengths.float(), None if kl is None else kl.detach(), None if xe is None else xe.detach())


def _baseline(net, batch, bank, vocab, cfg: ScstConfig, reward: torch.Tensor) -> torch.Tensor:
    if cfg.baseline == "loo":
        return loo_baseline(reward, cfg.k)
    if cfg.baseline == "none":
        return torch.zeros_like(reward)
    was_training = net.training
    net.eval()  # classic SCST: the greedy caption of the current policy, decoded in eval mode
    with torch.no_grad():
        decoded = greedy(net, batch["att"], batch["fc"], batch["att_mask"])
    net.train(was_training)
    greedy_reward = bank(vocab.decode_batch(decoded.tokens), batch["image_ids"].tolist(), fit=False).total
    return greedy_reward.to(reward.device).repeat_interleave(cfg.k)


def scst_scalars(accelerator, step: ScstStep, k: int) -> dict[str, float]:
    """Global (all-process) statistics of one SCST step, for tensorboard."""
    gathered = {name: accelerator.gather(v.to(accelerator.device)) for name, v in step.rewards.values.items()}
    total = accelerator.gather(step.rewards.total.to(accelerator.device))
    adv = accelerator.gather(step.advantage)
    out = {f"train/reward/{n}/mean": float(v.mean()) for n, v in gathered.items()}
    out.update({f"train/reward/{n}/std": float(v.std()) if v.numel() > 1 else 0.0 for n, v in gathered.items()})
    raw, normalized = step.rewards.values, step.rewards.normalized
    if normalized and any(not torch.equal(normalized[n], v) for n, v in raw.items()):
        normed = {n: accelerator.gather(v.to(accelerator.device)) for n, v in step.rewards.normalized.items()}
        out.update({f"train/reward/{n}/norm_mean": float(v.mean()) for n, v in normed.items()})
        out.update({f"train/reward/{n}/norm_std": float(v.std()) if v.numel() > 1 else 0.0 for n, v in normed.items()})
    for name, value in (("train/kl", step.kl), ("train/xe_anchor", step.xe)):
        if value is not None:
            out[name] = float(accelerator.reduce(value.to(accelerator.device), "mean"))
    out.update({f"train/reward/{n}/seconds": s for n, s in step.rewards.seconds.items()})
    flat = adv.view(-1, k)
    out.update({
        "train/reward/total": float(total.mean()),
        "train/advantage/mean": float(adv.mean()),
        "train/advantage/std": float(adv.std()) if adv.numel() > 1 else 0.0,
        "train/advantage/zero_groups": float((flat.abs().amax(1) < 1e-8).float().mean()),
        "train/sample/entropy": float(accelerator.reduce(step.entropy.to(accelerator.device), "mean")),
        "train/sample/length": float(accelerator.gather(step.lengths).mean()),
    })
    return out


def sample_table(step: ScstStep, image_ids: list[int], k: int, images: int = 3) -> tuple[list[str], list[list[str]]]:
    """Rows of (image, caption, each reward, total, baseline) for the first few images."""
    names = list(step.rewards.values)
    rows = []
    for i in range(min(images, len(image_ids))):
        for j in range(i * k, (i + 1) * k):
            rows.append([str(image_ids[i]), step.captions[j]]
                        + [f"{float(step.rewards.values[n][j]):.3f}" for n in names]
                        + [f"{float(step.rewards.total[j]):.3f}", f"{float(step.baseline[j]):.3f}"])
    return ["image", "sample", *names, "total", "baseline"], rows
