"""Decoding: greedy, sampling (K per image, one encoder pass, top-k / nucleus) and batched beam
search, each optionally under `Constraints` (no repeated trigram, no bad ending).

Every mode returns the same shapes and conventions: tokens [N, max_len] with 0 after the EOS,
and the log-probability of each emitted token (0 after the EOS). With `use_cache=True` the
decoder's self-attention keys/values are cached; with False the whole prefix is recomputed at
every step (the reference the cache is tested and benchmarked against). `DecodeConfig` holds the
options the commands and the per-epoch evaluation share; `decode` picks the mode from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from captioner.model import Captioner
from captioner.vocab import Vocab
from plumbing.config import option
from plumbing.errors import ConfigError
from plumbing.words import FUNCTION_WORDS


@dataclass
class DecodeConfig:
    """How captions are decoded; the same keys in `eval.*`, `captioner.evaluate` and `captioner.caption`."""

    beam_size: int = option(1, help="beam size (1 = greedy)", flag="--beam", at_least=1)
    length_penalty: float = option(0.0, help="beam: rank captions by log-prob / (words + 1) ** length_penalty",
                                   at_least=0)
    block_trigrams: bool = option(False, help="never repeat a trigram within a caption")
    remove_bad_endings: bool = option(False, help="no caption ends in a function word (a, of, the, ...)")
    sample_n: int = option(0, help="sample this many captions per image instead (0 = greedy or beam)", at_least=0)
    top_p: float = option(1.0, help="sampling: draw from the smallest set of words with this much probability",
                          above=0, at_most=1)
    temperature: float = option(1.0, help="sampling temperature", above=0)


@dataclass
class Constraints:
    """Rules applied to every step's next-token logits, in every decoding mode."""

    block_trigrams: bool = False
    bad_endings: torch.Tensor | None = None  # word ids a caption may not end with

    @classmethod
    def of(cls, cfg: DecodeConfig, vocab: Vocab) -> Constraints | None:
        if not (cfg.block_trigrams or cfg.remove_bad_endings):
            return None
        bad = [vocab.index[w] for w in sorted(FUNCTION_WORDS) if w in vocab.index] if cfg.remove_bad_endings else []
        return cls(cfg.block_trigrams, torch.tensor(bad, dtype=torch.long) if bad else None)

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor, t: int, max_len: int) -> torch.Tensor:
        """logits [N, V+1] of step t, given the tokens [N, >=t] emitted before it."""
        logits = logits.clone()
        if self.block_trigrams and t >= 3:
            # the trigram (w[t-2], w[t-1], c) is banned for every c that already followed that pair
            prev = tokens[:, :t]
            match = (prev[:, : t - 2] == prev[:, t - 2: t - 1]) & (prev[:, 1: t - 1] == prev[:, t - 1: t])
            rows, cols = match.nonzero(as_tuple=True)
            logits[rows, prev[rows, cols + 2]] = float("-inf")
        if self.bad_endings is not None and len(self.bad_endings):
            bad = self.bad_endings.to(logits.device)
            if t >= 1:
                ends_badly = torch.isin(tokens[:, t - 1], bad)
                logits[ends_badly, 0] = float("-inf")  # no EOS right after a function word
            if t == max_len - 1:
                logits[:, bad] = float("-inf")  # the caption is cut here: its last word must not be one
        return logits


@dataclass
class Decoded:
    tokens: torch.Tensor  # [N, T] long, 0 after EOS
    logprobs: torch.Tensor  # [N, T] float, log-prob of each token (EOS included), 0 after
    entropy: torch.Tensor | None = None  # [N, T] entropy of each step's distribution, 0 after

    @property
    def lengths(self) -> torch.Tensor:
        return (self.tokens > 0).sum(dim=1)


class _Stepper:
    """Feeds one token per sequence and returns next-token logits, with or without a KV cache."""

    def __init__(self, model: Captioner, mem_kv: list, mem_mask: torch.Tensor, n: int, use_cache: bool):
        self.model, self.mem_kv, self.mem_mask, self.use_cache = model, mem_kv, mem_mask, use_cache
        dtype = mem_kv[0][0].dtype
        self.cache = model.new_cache(n, mem_mask.device, dtype) if use_cache else None
        self.prefix = torch.zeros(n, 0, dtype=torch.long, device=mem_mask.device)
        self.t = 0

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.use_cache:
            logits = self.model.decode(tokens[:, None], self.mem_kv, self.mem_mask, self.cache, self.t)[:, -1]
        else:
            self.prefix = torch.cat([self.prefix, tokens[:, None]], dim=1)
            logits = self.model.decode(self.prefix, self.mem_kv, self.mem_mask)[:, -1]
        self.t += 1
        return logits.float()

    def reorder(self, index: torch.Tensor) -> None:
        self.mem_kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.mem_kv]
        self.mem_mask = self.mem_mask.index_select(0, index)
        if self.cache is not None:
            self.cache = [[c.index_select(0, index) for c in layer] for layer in self.cache]
        self.prefix = self.prefix.index_select(0, index)


def _encode(model: Captioner, att, fc, att_mask, repeat: int) -> tuple[list, torch.Tensor]:
    memory, mask = model.encode(att, fc, att_mask)
    mem_kv = model.memory_kv(memory)
    if repeat > 1:  # one encoder pass shared by the K samples of an image
        mem_kv = [(k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)) for k, v in mem_kv]
        mask = mask.repeat_interleave(repeat, 0)
    return mem_kv, mask


def _choose(logits: torch.Tensor, greedy: bool, temperature: float, top_k: int,
            top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logprobs = F.log_softmax(logits / temperature, dim=-1)
    probs = logprobs.exp()
    entropy = -(probs * logprobs).nan_to_num(0.0).sum(dim=-1)  # banned words: 0 * -inf counts 0
    if greedy:
        token = logprobs.argmax(dim=-1)
    else:
        weights = probs.detach()
        if top_k > 0:
            kth = torch.topk(weights, top_k, dim=-1).values[:, -1:]
            weights = torch.where(weights >= kth, weights, torch.zeros_like(weights))
        if top_p < 1.0:
            ordered, order = weights.sort(dim=-1, descending=True)
            outside = ordered.cumsum(dim=-1) - ordered >= top_p  # past the nucleus
            weights = weights.scatter(1, order, ordered.masked_fill(outside, 0.0))
        token = torch.multinomial(weights, 1)[:, 0]
    return token, logprobs.gather(1, token[:, None])[:, 0], entropy


@torch.no_grad()
def greedy(model: Captioner, att, fc, att_mask, max_len: int | None = None, use_cache: bool = True,
           constraints: Constraints | None = None) -> Decoded:
    return _unroll(model, att, fc, att_mask, 1, True, 1.0, 0, max_len, use_cache, 1.0, constraints)


def sample(model: Captioner, att, fc, att_mask, k: int = 5, temperature: float = 1.0, top_k: int = 0,
           max_len: int | None = None, use_cache: bool = True, top_p: float = 1.0,
           constraints: Constraints | None = None) -> Decoded:
    """K samples per image, rows grouped by image (image i -> rows i*K..i*K+K-1).
    Runs under the caller's grad mode (SCST recomputes log-probs with gradients)."""
    return _unroll(model, att, fc, att_mask, k, False, temperature, top_k, max_len, use_cache, top_p, constraints)


@torch.no_grad()
def decode(model: Captioner, att, fc, att_mask, cfg: DecodeConfig, constraints: Constraints | None = None) -> Decoded:
    """The mode `cfg` asks for: sample_n samples per image, else beam search, else greedy."""
    if cfg.beam_size > model.vocab_size + 1 and not cfg.sample_n:  # checked before the beams' memory is taken
        raise ConfigError(f"beam size {cfg.beam_size} is more than the {model.vocab_size + 1} tokens a step can "
                          "choose from (the vocabulary and EOS)")
    if cfg.sample_n:
        return sample(model, att, fc, att_mask, cfg.sample_n, cfg.temperature, top_p=cfg.top_p,
                      constraints=constraints)
    if cfg.beam_size > 1:
        return beam_search(model, att, fc, att_mask, cfg.beam_size, cfg.length_penalty, constraints=constraints)
    return greedy(model, att, fc, att_mask, constraints=constraints)


def _unroll(model, att, fc, att_mask, repeat, is_greedy, temperature, top_k, max_len, use_cache,
            top_p: float = 1.0, constraints: Constraints | None = None) -> Decoded:
    max_len = max_len or model.max_len
    mem_kv, mask = _encode(model, att, fc, att_mask, repeat)
    n = mask.shape[0]
    stepper = _Stepper(model, mem_kv, mask, n, use_cache)
    tokens = torch.zeros(n, max_len, dtype=torch.long, device=mask.device)
    steps_lp, steps_ent = [], []  # lists, not in-place writes, so gradients can flow (SCST)
    current = torch.zeros(n, dtype=torch.long, device=mask.device)  # BOS
    alive = torch.ones(n, dtype=torch.bool, device=mask.device)
    for t in range(max_len):
        logits = stepper.step(current)
        if constraints is not None:
            logits = constraints.apply(logits, tokens, t, max_len)
        token, logprob, entropy = _choose(logits, is_greedy, temperature, top_k, top_p)
        token = torch.where(alive, token, torch.zeros_like(token))
        tokens[:, t] = token
        steps_lp.append(torch.where(alive, logprob, torch.zeros_like(logprob)))
        steps_ent.append(torch.where(alive, entropy, torch.zeros_like(entropy)))
        alive = alive & (token != 0)
        if not alive.any():
            break
        current = token
    pad = max_len - len(steps_lp)
    logprobs = F.pad(torch.stack(steps_lp, dim=1), (0, pad))
    return Decoded(tokens, logprobs, F.pad(torch.stack(steps_ent, dim=1), (0, pad)))


@torch.no_grad()
def beam_search(model: Captioner, att, fc, att_mask, beam: int = 3, length_penalty: float = 0.0,
                max_len: int | None = None, use_cache: bool = True, constraints: Constraints | None = None) -> Decoded:
    """Batched beam search; the best beam per image by score / length ** length_penalty, with the
    length counted in tokens including the EOS (words + 1)."""
    max_len = max_len or model.max_len
    mem_kv, mask = _encode(model, att, fc, att_mask, beam)
    b = att.shape[0]
    n = b * beam
    device = mask.device
    stepper = _Stepper(model, mem_kv, mask, n, use_cache)
    scores = torch.full((b, beam), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    tokens = torch.zeros(n, max_len, dtype=torch.long, device=device)
    token_lp = torch.zeros(n, max_len, device=device)
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    current = torch.zeros(n, dtype=torch.long, device=device)
    for t in range(max_len):
        logits = stepper.step(current)
        if constraints is not None:
            logits = constraints.apply(logits, tokens, t, max_len)
        logprobs = F.log_softmax(logits, dim=-1)
        # A finished beam can only continue with EOS at no cost, keeping its score fixed.
        done_row = torch.full_like(logprobs, float("-inf"))
        done_row[:, 0] = 0.0
        logprobs = torch.where(finished[:, None], done_row, logprobs)
        vocab = logprobs.shape[1]
        total = (scores.view(n, 1) + logprobs).view(b, beam * vocab)
        scores, flat = total.topk(beam, dim=1)
        origin = (flat // vocab) + torch.arange(b, device=device)[:, None] * beam
        origin, chosen = origin.view(-1), (flat % vocab).view(-1)
        stepper.reorder(origin)
        tokens, token_lp, finished = tokens[origin], token_lp[origin], finished[origin]
        tokens[:, t] = torch.where(finished, torch.zeros_like(chosen), chosen)
        token_lp[:, t] = torch.where(finished, torch.zeros_like(chosen, dtype=token_lp.dtype),
                                     logprobs[origin, chosen])
        finished = finished | (chosen == 0)
        if finished.all():
            break
        current = chosen
    lengths = ((tokens > 0).sum(1) + 1).clamp(max=max_len).float().view(b, beam)
    normalised = scores / lengths ** length_penalty if length_penalty else scores
    best = normalised.argmax(dim=1) + torch.arange(b, device=device) * beam
    return Decoded(tokens[best], token_lp[best])
