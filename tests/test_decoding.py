from __future__ import annotations

import pytest
import torch

from captioner.decoding import DecodeConfig, beam_search, decode, greedy, sample
from captioner.model import Captioner, ModelConfig
from plumbing.errors import ConfigError


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=48, n_heads=4, enc_layers=2, dec_layers=2, d_ff=96, dropout=0.0, use_pooled=True)
    net = Captioner(cfg, vocab_size=25, max_len=14, feat_dim=20, n_tokens=9, fc_dim=20).eval()
    with torch.no_grad():  # make EOS likely enough that sequences end at different steps
        net.embed.weight[0] *= 2
    return net


def inputs(b=4):
    g = torch.Generator().manual_seed(1)
    att = torch.randn(b, 9, 20, generator=g)
    mask = torch.ones(b, 9, dtype=torch.bool)
    mask[1, 6:] = False  # a padded region set
    return att, att.mean(1), mask


@pytest.mark.parametrize("mode", ["greedy", "sample", "beam"])
def test_cached_decoding_equals_full_recomputation(model, mode):
    att, fc, mask = inputs()
    outs = []
    for cache in (True, False):
        torch.manual_seed(5)
        with torch.no_grad():
            if mode == "greedy":
                outs.append(greedy(model, att, fc, mask, use_cache=cache))
            elif mode == "sample":
                outs.append(sample(model, att, fc, mask, k=3, temperature=0.9, top_k=10, use_cache=cache))
            else:
                outs.append(beam_search(model, att, fc, mask, beam=3, length_penalty=0.5, use_cache=cache))
    assert torch.equal(outs[0].tokens, outs[1].tokens)
    torch.testing.assert_close(outs[0].logprobs, outs[1].logprobs, atol=1e-5, rtol=0)
    lengths = outs[0].lengths
    assert lengths.min() < lengths.max() or mode == "beam"  # sequences ended at different steps


def test_eos_and_padding_conventions(model):
    att, fc, mask = inputs()
    with torch.no_grad():
        outputs = (greedy(model, att, fc, mask), sample(model, att, fc, mask, k=2),
                   beam_search(model, att, fc, mask, 2))
        for out in outputs:
            for row, lps in zip(out.tokens.tolist(), out.logprobs.tolist(), strict=True):
                if 0 in row:
                    first = row.index(0)
                    assert all(t == 0 for t in row[first:])
                    assert all(v == 0 for v in lps[first + 1:]) and lps[first] <= 0  # EOS has a log-prob


def test_beam_of_one_is_greedy_and_samples_share_the_encoder(model):
    att, fc, mask = inputs()
    assert torch.equal(beam_search(model, att, fc, mask, beam=1).tokens, greedy(model, att, fc, mask).tokens)
    with torch.no_grad():
        out = sample(model, att, fc, mask, k=4)
    assert out.tokens.shape == (16, 14)


def test_a_beam_wider_than_the_vocabulary_is_a_config_error(model):
    att, fc, mask = inputs(2)
    assert decode(model, att, fc, mask, DecodeConfig(beam_size=26)).tokens.shape == (2, 14)  # 25 words and EOS
    with pytest.raises(ConfigError, match="beam size 27 is more than the 26 tokens"):
        decode(model, att, fc, mask, DecodeConfig(beam_size=27))


def test_sampled_logprobs_are_the_policy_logprobs(model):
    """Re-scoring sampled captions with teacher forcing gives the sampler's log-probs (SCST relies on it)."""
    att, fc, mask = inputs(2)
    torch.manual_seed(3)
    with torch.no_grad():
        out = sample(model, att, fc, mask, k=2)
        logits = model(att, fc, mask, out.tokens.view(2, 2, -1))
    logp = torch.log_softmax(logits, -1)[:, :-1].gather(2, out.tokens[:, :, None])[:, :, 0]
    alive = torch.cat([torch.ones(4, 1, dtype=torch.bool), out.tokens[:, :-1] > 0], 1)
    torch.testing.assert_close(logp * alive, out.logprobs, atol=1e-5, rtol=0)


# --- decoding options -----------------------------------------------------------------------------

def _vocab(size: int):
    from captioner.vocab import Vocab

    words = ["a", "the", "of", "on", "red", "circle", "square", "with", "and", "blue"]
    words += [f"w{i}" for i in range(size - len(words))]
    return Vocab({str(i + 1): w for i, w in enumerate(words)})


class _Biased(Captioner):
    """A random captioner with a fixed bias on its logits: "a", "the", "of" (function words) are the
    likeliest words, so plain decoding repeats itself; `eos` sets how likely EOS is."""

    eos = -6.0

    def decode(self, tokens, mem_kv, mem_mask, cache=None, start=0):
        logits = super().decode(tokens, mem_kv, mem_mask, cache, start)
        bias = torch.zeros(logits.shape[-1])
        bias[1:4] = 4.0
        bias[0] = self.eos
        return logits + bias


def _repetitive_model(eos: float = -6.0):
    torch.manual_seed(3)
    cfg = ModelConfig(d_model=32, n_heads=2, enc_layers=1, dec_layers=1, d_ff=64, dropout=0.0)
    net = _Biased(cfg, vocab_size=25, max_len=16, feat_dim=20, n_tokens=9, fc_dim=20).eval()
    net.eos = eos
    return net


def _trigrams(tokens: list[int]) -> list[tuple[int, ...]]:
    words = tokens[: tokens.index(0)] if 0 in tokens else tokens
    return [tuple(words[i:i + 3]) for i in range(len(words) - 2)]


@pytest.mark.parametrize("mode", ["greedy", "beam", "sample"])
def test_block_trigrams_never_repeats_a_trigram(mode):
    from captioner.decoding import Constraints, DecodeConfig, decode

    net, vocab = _repetitive_model(), _vocab(25)
    att, fc, mask = inputs(6)
    cfg = DecodeConfig(beam_size=3 if mode == "beam" else 1, sample_n=4 if mode == "sample" else 0,
                       block_trigrams=True)
    plain = decode(net, att, fc, mask, DecodeConfig(beam_size=cfg.beam_size, sample_n=cfg.sample_n))
    assert any(len(t) != len(set(t)) for t in map(_trigrams, plain.tokens.tolist()))  # the test can fail
    torch.manual_seed(0)
    out = decode(net, att, fc, mask, cfg, Constraints.of(cfg, vocab))
    for row in out.tokens.tolist():
        grams = _trigrams(row)
        assert len(grams) == len(set(grams)), row


@pytest.mark.parametrize("mode", ["greedy", "beam", "sample"])
def test_remove_bad_endings_never_ends_in_a_function_word(mode):
    from captioner.decoding import Constraints, DecodeConfig, decode
    from plumbing.words import FUNCTION_WORDS

    net, vocab = _repetitive_model(eos=2.5), _vocab(25)  # EOS about as likely as "a", "the", "of"
    att, fc, mask = inputs(6)
    cfg = DecodeConfig(beam_size=3 if mode == "beam" else 1, sample_n=4 if mode == "sample" else 0)

    def last_words(out) -> list[str]:
        return [c.split()[-1] for c in vocab.decode_batch(out.tokens) if c]

    torch.manual_seed(0)
    plain = last_words(decode(net, att, fc, mask, cfg))
    cfg.remove_bad_endings = True
    torch.manual_seed(0)
    fixed = last_words(decode(net, att, fc, mask, cfg, Constraints.of(cfg, vocab)))
    assert any(w in FUNCTION_WORDS for w in plain) or mode != "greedy"
    assert fixed and not any(w in FUNCTION_WORDS for w in fixed), fixed


class _ToyDecoder(torch.nn.Module):
    """A 'model' with known log-probs: from BOS, word 1 (p .6) or word 2 (p .4); after 1, EOS (p .5)
    or word 3 (p .5); after 2, word 3 (p .9); after 3, EOS (p .99). Captions: [1] = .3,
    [1 3] = .2970, [2 3] = .3564."""

    max_len = 4

    def __init__(self):
        super().__init__()
        table = torch.full((5, 5), 1e-9)
        table[0, 1], table[0, 2] = 0.6, 0.4
        table[1, 0], table[1, 3] = 0.5, 0.5
        table[2, 3], table[2, 0] = 0.9, 0.1
        table[3, 0], table[3, 3] = 0.99, 0.01
        table[4, 0] = 1.0
        self.table = torch.log(table / table.sum(1, keepdim=True))

    def encode(self, att, fc, mask):
        return att, mask

    def memory_kv(self, memory):
        return [(memory, memory)]

    def new_cache(self, n, device, dtype):
        return None

    def decode(self, tokens, mem_kv, mem_mask, cache=None, start=0):
        return self.table[tokens]


def test_length_penalty_changes_the_beam_choice_as_its_formula_says():
    from captioner.decoding import beam_search

    toy = _ToyDecoder()
    att, mask = torch.zeros(1, 1, 1), torch.ones(1, 1, dtype=torch.bool)
    logp = {(1,): toy.table[0, 1] + toy.table[1, 0], (2, 3): toy.table[0, 2] + toy.table[2, 3] + toy.table[3, 0]}

    def best(penalty: float) -> tuple[int, ...]:
        # score / (words + 1) ** penalty, as beam_search documents
        return max(logp, key=lambda c: float(logp[c]) / (len(c) + 1) ** penalty)

    for penalty in (0.0, 1.0):
        out = beam_search(toy, att, att[:, 0], mask, beam=2, length_penalty=penalty, use_cache=False)
        words = tuple(t for t in out.tokens[0].tolist() if t)
        assert words == best(penalty), (penalty, words)
    assert best(0.0) != best(1.0) or float(logp[(1,)]) < float(logp[(2, 3)])


def test_nucleus_sampling_keeps_to_the_top_p_mass():
    from captioner.decoding import _choose

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    torch.manual_seed(0)
    tokens, _, _ = _choose(logits, greedy=False, temperature=1.0, top_k=0, top_p=0.75)
    assert set(tokens.tolist()) == {0, 1}
