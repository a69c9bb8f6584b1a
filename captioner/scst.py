"""Self-critical sequence training: K samples per image, rewards from the bank, a baseline,
and a token-level policy-gradient loss masked after EOS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from captioner.decoding import Decoded, greedy
from captioner.vocab import Vocab
from plumbing.config import option
from plumbing.errors import ConfigError
from rewards import RewardBank, RewardOutput


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
    sample_table_every: int = option(100, help="steps between logged tables of samples", at_least=1)


def check_scst_config(cfg: ScstConfig) -> None:
    if cfg.baseline == "loo" and cfg.k < 2:
        raise ConfigError(f"scst.baseline 'loo' needs scst.k >= 2 (the mean of the other samples); got k={cfg.k}")
    if cfg.k < 1:
        raise ConfigError("scst.k must be >= 1")


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
    alive = torch.cat([torch.ones_like(drawn.tokens[:, :1], dtype=torch.bool), drawn.tokens[:, :-1] > 0], dim=1)
    token_lp = logp.gather(2, drawn.tokens[:, :, None])[:, :, 0] * alive
    entropy = -(logp.exp() * logp).sum(-1) * alive
    return Decoded(drawn.tokens, token_lp, entropy)


def scst_step(model, net, batch: dict, bank: RewardBank, vocab: Vocab, cfg: ScstConfig) -> ScstStep:
    out = policy_outputs(model, net, batch, cfg)
    captions = vocab.decode_batch(out.tokens)
    ids = batch["image_ids"].repeat_interleave(cfg.k).tolist()
    scored = bank(captions, ids)
    reward = scored.total.to(out.logprobs.device)
    baseline = _baseline(net, batch, bank, vocab, cfg, reward)
    advantage = reward - baseline
    if cfg.scale_by_std:
        advantage = advantage / (reward.view(-1, cfg.k).std(1, keepdim=True).expand(-1, cfg.k).reshape(-1) + 1e-6)
    alive = torch.cat([torch.ones_like(out.tokens[:, :1], dtype=torch.bool), out.tokens[:, :-1] > 0], dim=1)
    mask = alive.float()
    loss = -(advantage.detach()[:, None] * out.logprobs * mask).sum() / mask.sum()
    entropy = (out.entropy * mask).sum() / mask.sum()
    if cfg.entropy_bonus:
        loss = loss - cfg.entropy_bonus * entropy
    return ScstStep(loss, scored, advantage.detach(), baseline.detach(), captions, entropy.detach(),
                    out.lengths.float())


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
    greedy_reward = bank(vocab.decode_batch(decoded.tokens), batch["image_ids"].tolist()).total
    return greedy_reward.to(reward.device).repeat_interleave(cfg.k)


def scst_scalars(accelerator, step: ScstStep, k: int) -> dict[str, float]:
    """Global (all-process) statistics of one SCST step, for tensorboard."""
    gathered = {name: accelerator.gather(v.to(accelerator.device)) for name, v in step.rewards.values.items()}
    total = accelerator.gather(step.rewards.total.to(accelerator.device))
    adv = accelerator.gather(step.advantage)
    out = {f"train/reward/{n}/mean": float(v.mean()) for n, v in gathered.items()}
    out.update({f"train/reward/{n}/std": float(v.std()) if v.numel() > 1 else 0.0 for n, v in gathered.items()})
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
