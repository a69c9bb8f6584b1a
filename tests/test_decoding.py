from __future__ import annotations

import pytest
import torch

from captioner.decoding import beam_search, greedy, sample
from captioner.model import Captioner, ModelConfig


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
