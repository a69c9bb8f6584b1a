"""The reward bank and SCST: weights, baselines, a toy policy that learns, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from captioner import train as train_cli
from captioner.model import Captioner, ModelConfig
from captioner.scst import ScstConfig, check_scst_config, loo_baseline, scst_step
from captioner.vocab import Vocab
from plumbing.errors import ConfigError, RlcapError
from rewards import RewardBank
from rewards.bank import available_rewards, register_reward
from tests.captioner_fixtures import (
    launch_two_processes,
    prepare_tiny_data,
    tiny_config,
)


class Fixed:
    def __init__(self, name, value):
        self.name, self.value = name, value

    def __call__(self, captions, image_ids):
        return torch.full((len(captions),), self.value)


class WordShare:
    """Share of words equal to `word` (the toy policy's goal)."""

    name = "word_share"

    def __init__(self, word):
        self.word = word

    def __call__(self, captions, image_ids):
        return torch.tensor([c.split().count(self.word) / max(1, len(c.split())) for c in captions])


register_reward("test_one", lambda ctx: Fixed("test_one", 1.0))
register_reward("test_zero", lambda ctx: Fixed("test_zero", 0.0))
register_reward("test_nan", lambda ctx: Fixed("test_nan", math.nan))
register_reward("test_shape", lambda ctx: (lambda captions, ids: torch.zeros(len(captions) + 1)))
register_reward("test_word", lambda ctx: WordShare("w3"))


def test_weighted_total_and_per_reward_values():
    bank = RewardBank.from_config({"test_one": 0.7, "test_zero": 0.3})
    out = bank(["a b", "c"], [1, 2])
    assert torch.allclose(out.total, torch.tensor([0.7, 0.7]))
    assert set(out.values) == {"test_one", "test_zero"} and set(out.seconds) == {"test_one", "test_zero"}


def test_loo_baseline_by_hand():
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0])  # two images, K = 3
    expected = torch.tensor([(2 + 3) / 2, (1 + 3) / 2, (1 + 2) / 2, 0.0, 3.0, 3.0])
    assert torch.allclose(loo_baseline(rewards, 3), expected)


def test_bank_errors_name_the_reward():
    with pytest.raises(ConfigError, match="unknown reward 'cidr_d'.*cider_d"):
        RewardBank.from_config({"cidr_d": 1.0})
    with pytest.raises(ConfigError, match="all weights are zero"):
        RewardBank.from_config({"test_one": 0.0, "test_zero": 0})
    with pytest.warns(UserWarning, match="negative weight"):
        RewardBank.from_config({"test_one": -0.5, "test_zero": 1.0})
    with pytest.raises(RlcapError, match="reward 'test_nan' returned 2 non-finite"):
        RewardBank.from_config({"test_nan": 1.0})(["a", "b"], [1, 2])
    with pytest.raises(RlcapError, match=r"reward 'test_shape' returned shape \(3,\), expected \(2,\)"):
        RewardBank.from_config({"test_shape": 1.0})(["a", "b"], [1, 2])
    with pytest.raises(ConfigError, match="'loo' needs scst.k >= 2"):
        check_scst_config(ScstConfig(k=1, baseline="loo"))
    assert {"cider_d", "cider", "bleu_4", "length", "constant"} <= set(available_rewards())


def toy_model(dropout: float = 0.0):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=2, enc_layers=1, dec_layers=1, d_ff=64, dropout=dropout)
    return Captioner(cfg, vocab_size=6, max_len=5, feat_dim=8, n_tokens=4, fc_dim=8)


def toy_batch():
    torch.manual_seed(1)
    att = torch.randn(4, 4, 8)
    return {"att": att, "fc": att.mean(1), "att_mask": torch.ones(4, 4, dtype=torch.bool),
            "image_ids": torch.arange(4)}


VOCAB = Vocab({str(i): f"w{i}" for i in range(1, 7)})


@pytest.mark.parametrize("baseline,memory", [("loo", False), ("greedy", False), ("none", True), ("loo", True)])
def test_toy_policy_learns_the_rewarded_token(baseline, memory):
    model, batch = toy_model(), toy_batch()
    bank = RewardBank.from_config({"test_word": 1.0})
    cfg = ScstConfig(k=4, baseline=baseline, memory_mode=memory)

    def share():
        with torch.no_grad():
            probs = torch.softmax(model(batch["att"], batch["fc"], batch["att_mask"],
                                        torch.zeros(4, 1, 5, dtype=torch.long))[:, 0], -1)
        return float(probs[:, 3].mean())

    before = share()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(25):
        step = scst_step(model, model, batch, bank, VOCAB, cfg)
        optimizer.zero_grad()
        step.loss.backward()
        optimizer.step()
    assert share() > before + 0.3, (before, share())


def test_greedy_baseline_is_the_reward_of_the_greedy_caption():
    from captioner.decoding import greedy

    model, batch = toy_model(), toy_batch()
    bank = RewardBank.from_config({"test_word": 1.0})
    step = scst_step(model, model, batch, bank, VOCAB, ScstConfig(k=3, baseline="greedy"))
    model.eval()
    expected = bank(VOCAB.decode_batch(greedy(model, batch["att"], batch["fc"], batch["att_mask"]).tokens),
                    [0, 1, 2, 3]).total.repeat_interleave(3)
    assert torch.allclose(step.baseline, expected)
    assert torch.allclose(step.advantage, step.rewards.total - expected)


@pytest.fixture(scope="module")
def tiny_data(tiny_world, tmp_path_factory):
    return prepare_tiny_data(tiny_world, tmp_path_factory.mktemp("scstdata"))


def test_scst_stage_end_to_end_with_cider_d(tiny_data, tmp_path):
    xe = tiny_config(tiny_data, tmp_path, name="xe", train={"epochs": 1})
    assert train_cli.main(["--config", str(xe), "--no-progress"]) == 0
    scst = tiny_config(tiny_data, tmp_path, name="scst", train={"epochs": 1, "stage": "scst", "log_every": 1},
                       optim={"lr": 1e-4, "warmup_steps": 0},
                       scst={"rewards": {"cider_d": 0.6, "length": 0.4}, "k": 3,
                             "init_from": str(tmp_path / "xe" / "checkpoints" / "last"), "sample_table_every": 2})
    assert train_cli.main(["--config", str(scst), "--no-progress"]) == 0
    record = json.loads((tmp_path / "scst" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["stage"] == "scst"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "scst" / "tensorboard")).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/reward/cider_d/mean", "train/reward/length/std", "train/reward/total",
            "train/advantage/mean", "train/sample/entropy"} <= tags
    # bad inputs through the command
    assert train_cli.main(["--config", str(scst), "--set", "scst.rewards={nope: 1}"]) == 2
    assert train_cli.main(["--config", str(scst), "--set", "scst.k=1"]) == 2


def test_scst_under_two_processes(tiny_data, tmp_path):
    """Each process samples and scores its own images; the run writes one metrics line per epoch."""
    xe = tiny_config(tiny_data, tmp_path, name="xe2", train={"epochs": 1})
    assert train_cli.main(["--config", str(xe), "--no-progress"]) == 0
    scst = tiny_config(tiny_data, tmp_path, name="scst2", data={"batch_size": 4},
                       train={"epochs": 1, "stage": "scst", "log_every": 1}, optim={"lr": 1e-4, "warmup_steps": 0},
                       scst={"rewards": {"cider_d": 1.0}, "k": 3,
                             "init_from": str(tmp_path / "xe2" / "checkpoints" / "last")})
    result = launch_two_processes(scst)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = (tmp_path / "scst2" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["stage"] == "scst"


def test_the_kl_term_is_zero_at_the_reference_and_its_gradient_is_the_hand_formula():
    from captioner.scst import kl_to_reference

    torch.manual_seed(0)
    theta = torch.randn(3, 6, requires_grad=True)  # a toy policy: 3 positions, 6 words each
    tokens = torch.tensor([[1], [4], [0]])
    mask = torch.tensor([[1.0], [1.0], [0.0]])  # the third position is past the EOS
    logp = torch.log_softmax(theta, dim=-1).gather(1, tokens)
    zero = kl_to_reference(logp, logp.detach(), mask)
    assert float(zero.detach()) == 0.0
    zero.backward()
    assert torch.allclose(theta.grad, torch.zeros_like(theta))
    theta.grad = None
    ref = torch.log(torch.tensor([[0.3], [0.1], [0.5]]))
    kl = kl_to_reference(torch.log_softmax(theta, dim=-1).gather(1, tokens), ref, mask)
    kl.backward()
    probs = torch.softmax(theta.detach(), dim=-1)
    hand = torch.zeros_like(theta)
    for row in range(2):  # d/dθ [exp(r - lp) - (r - lp) - 1] / n = (1 - exp(r - lp)) (onehot - p) / n
        lp = torch.log(probs[row, tokens[row, 0]])
        onehot = torch.nn.functional.one_hot(tokens[row, 0], 6).float()
        hand[row] = (1 - torch.exp(ref[row, 0] - lp)) * (onehot - probs[row]) / 2
    assert torch.allclose(theta.grad, hand, atol=1e-6)
    assert float(kl.detach()) > 0


def test_with_a_kl_anchor_the_policy_drops_dropout_so_its_first_kl_is_zero():
    """Dropout on the sampling policy alone would make the KL to its frozen eval-mode start positive
    before any update; with kl_coef > 0 the trainer turns it off (scst.disable_dropout, default)."""
    import copy

    from captioner.scst import policy_dropout_off

    model, batch = toy_model(dropout=0.3), toy_batch()
    reference = copy.deepcopy(model).eval()
    bank = RewardBank.from_config({"test_word": 1.0})
    kls = {}
    for disable in (None, False):
        cfg = ScstConfig(k=3, kl_coef=0.5, disable_dropout=disable)
        model.train(not policy_dropout_off(cfg))
        torch.manual_seed(0)
        kls[disable] = float(scst_step(model, model, batch, bank, VOCAB, cfg, reference).kl)
    assert kls[None] == pytest.approx(0.0, abs=1e-6) and kls[False] > 1e-3
    assert not policy_dropout_off(ScstConfig()) and policy_dropout_off(ScstConfig(disable_dropout=True))


def test_batch_z_gives_each_reward_zero_mean_and_unit_std():
    from rewards import RewardNormalizer

    torch.manual_seed(0)
    norm = RewardNormalizer("batch_z")
    for name, scale in (("cider_d", 3.0), ("clip_s", 0.4)):
        values = torch.randn(250, dtype=torch.float64) * scale + 2.0
        z = norm(name, values)
        assert abs(float(z.mean())) < 1e-9 and abs(float(z.std(unbiased=False)) - 1) < 1e-4
    running = RewardNormalizer("running_z")
    first = running("r", torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    assert torch.allclose(first, norm("r", torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)))
    state = running.state_dict()
    again = RewardNormalizer("running_z")
    again.load_state_dict(state)
    batch = torch.tensor([5.0, 6.0], dtype=torch.float64)
    assert torch.equal(running("r", batch), again("r", batch))


def test_a_normalised_mix_weighs_rewards_by_weight_not_range():
    from rewards import RewardBank

    class Scaled:
        def __init__(self, name, scale):
            self.name, self.scale = name, scale

        def __call__(self, captions, image_ids):
            return torch.arange(len(captions), dtype=torch.float64) * self.scale

    bank = RewardBank({"big": Scaled("big", 10.0), "small": Scaled("small", 0.1)}, {"big": 0.5, "small": 0.5},
                      normalize="batch_z")
    out = bank(["a"] * 4, [1, 2, 3, 4])
    assert torch.allclose(out.normalized["big"], out.normalized["small"])
    assert torch.allclose(out.values["big"], torch.tensor([0.0, 10.0, 20.0, 30.0]))
