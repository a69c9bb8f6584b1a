"""The reward-model factory: each real checkpoint layout, built tiny, saved, loaded back by path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from open_clip.tokenizer import SimpleTokenizer

from features.clip_models.factory import load_reward_model
from features.clip_models.lclip import LClip
from features.clip_models.longclip import (
    HEADS_KEY,
    LONG_CONTEXT,
    longclip_from_state,
    longclip_state,
    regroup_text_heads,
    stretch_positions,
    stretch_state_dict,
    text_heads,
)
from features.clip_models.spec import RewardModelSpec
from plumbing.errors import ConfigError, DataError
from tests.clip_fixtures import (
    TINY_ARCH,
    TINY_LCLIP,
    clip_state,
    save_lclip,
    save_longclip,
    save_open_clip,
)

TEXTS = ["a red circle", "", "two small blue squares left of a big green triangle on a grey background " * 6,
         "word " * 1000, "Ünïcödé — “quotes” & émoji 🙂"]


def _trimmed_equals_full(model, full_forward, context: int) -> None:
    ids = model.tokenizer.ids(TEXTS)
    trimmed = F.normalize(model.encode_tokens(model.tokenizer.padded(ids)), dim=-1)
    full = F.normalize(full_forward(model.tokenizer.padded(ids, context)), dim=-1)
    assert (trimmed - full).abs().max() < 1e-5


def test_open_clip_file_tokens_and_trimmed_forward(tmp_path):
    weights = save_open_clip(tmp_path / "clip.safetensors")
    model = load_reward_model(RewardModelSpec(arch=TINY_ARCH, weights=str(weights)))
    assert torch.equal(model.tokenizer(TEXTS), SimpleTokenizer(context_length=77)(TEXTS))
    assert model.tokenizer.truncated == 2  # the long repeated caption and the 1,000-word one
    ids = model.tokenizer.ids(TEXTS)
    assert max(map(len, ids)) == 77 and ids[3][-1] == model.tokenizer.eot
    _trimmed_equals_full(model, model.module.encode_text, 77)


def test_stretch_follows_the_longclip_loop():
    table = torch.randn(77, 6, dtype=torch.float64)
    keep, expected = 20, torch.zeros(248, 6, dtype=torch.float64)
    expected[:keep] = table[:keep]
    for i in range(77 - 1 - keep):  # LongCLIP's load_from_clip, written out
        a, b = table[i + keep], table[i + 1 + keep]
        expected[4 * i + keep: 4 * i + keep + 4] = torch.stack([a, 3 * a / 4 + b / 4, a / 2 + b / 2, a / 4 + 3 * b / 4])
    step = table[-1] - table[-2]
    expected[-4:] = torch.stack([table[-1] + j * step / 4 for j in range(4)])
    assert torch.allclose(stretch_positions(table), expected, atol=1e-12)


def test_longclip_checkpoint_effective_positions_and_248_context(tmp_path):
    path = save_longclip(tmp_path / "spec.pt")
    raw = torch.load(path, weights_only=True)
    model = load_reward_model(RewardModelSpec(kind="longclip", weights=str(path)))
    assert model.context_length == LONG_CONTEXT == 248
    effective = torch.cat([raw["positional_embedding"][:20], raw["positional_embedding_res"][20:]])
    assert torch.equal(model.module.positional_embedding.detach(), effective)
    ids = model.tokenizer.ids(TEXTS)
    assert 77 < len(ids[2]) < 248 and len(ids[3]) == 248  # long captions keep 248 tokens, not 77
    _trimmed_equals_full(model, model.module.encode_text, 248)


def test_longclip_files_keep_a_text_tower_with_other_heads(tmp_path):
    """The layout fixes heads at width // 64: a width-128 tower run as four heads is written with
    `text_heads` and reads texts as before; without the entry the same weights read them otherwise."""
    model = longclip_from_state(stretch_state_dict(clip_state(3)))
    assert text_heads(model) == 2 and HEADS_KEY not in longclip_state(model)
    regroup_text_heads(model, 4, "test")
    state = longclip_state(model)
    assert int(state[HEADS_KEY]) == 4
    torch.save(state, tmp_path / "spec.pt")
    torch.save({k: v for k, v in state.items() if k != HEADS_KEY}, tmp_path / "two_heads.pt")
    loaded = load_reward_model(RewardModelSpec(kind="longclip", weights=str(tmp_path / "spec.pt")))
    plain = load_reward_model(RewardModelSpec(kind="longclip", weights=str(tmp_path / "two_heads.pt")))
    tokens = loaded.tokenizer(TEXTS[:3])
    with torch.no_grad():
        expected = model.encode_text(tokens)
        assert torch.allclose(loaded.module.encode_text(tokens), expected, atol=1e-6)
        assert not torch.allclose(plain.module.encode_text(tokens), expected, atol=1e-3)
    _trimmed_equals_full(loaded, loaded.module.encode_text, 248)  # the shared-prefix forward reads the heads too


def test_lclip_lightning_checkpoint_loads_the_student(tmp_path):
    path, original = save_lclip(tmp_path / "lclip.ckpt")
    model = load_reward_model(RewardModelSpec(kind="lclip", weights=str(path)))
    assert isinstance(model.module, LClip) and model.module.config == TINY_LCLIP
    other_heads = load_reward_model(RewardModelSpec(kind="lclip", weights=str(path), heads=4))
    assert other_heads.fingerprint != model.fingerprint  # embeds files made with other heads are refused
    images = torch.randn(3, 3, 32, 32)
    assert torch.allclose(model.encode_image(images), original.encode_image(images), atol=1e-6)
    _trimmed_equals_full(model, original.encode_text, 77)
    # the factorised embedding and the multiplexed norms are really in the layout
    keys = set(model.module.state_dict())
    assert {"text_encoder.token_embedding.weight", "text_encoder.token_projection.weight",
            "image_encoder.blocks.1.norm1.instances.1.weight"} <= keys
    assert model.module.text_encoder.token_embedding.weight.shape == (49408, 16)


@pytest.mark.parametrize("stem_norm", [False, True])
def test_lclip_conv_stem_students_load_with_their_stem(tmp_path, stem_norm):
    """A student with a conv stem (and BatchNorms in it) is read back from the tensors alone: the
    stem's widths, whether it has norms, and their running statistics, which eval mode uses."""
    config = dataclasses.replace(TINY_LCLIP, patch_size=8, stem_channels=(4, 8), stem_norm=stem_norm)
    torch.manual_seed(3)
    student = LClip(config)
    with torch.no_grad():  # one training-mode pass moves the running statistics off their init
        student.train().encode_image(torch.randn(8, 3, 32, 32) * 3 + 1)
    student.eval()
    path = tmp_path / "stem.ckpt"
    torch.save({"state_dict": {f"student.{k}": v for k, v in student.state_dict().items()}}, path)
    model = load_reward_model(RewardModelSpec(kind="lclip", weights=str(path)))
    assert model.module.config == config
    images = torch.randn(3, 3, 32, 32)
    assert torch.allclose(model.encode_image(images), student.encode_image(images), atol=1e-6)
    if stem_norm:
        assert float(model.module.image_encoder.stem[1].running_mean.abs().sum()) > 0


@pytest.mark.parametrize("repeats", [1, 2, 4])
def test_lclip_students_load_with_the_runs_of_their_shared_blocks(tmp_path, repeats):
    """How often each shared block runs is read off the checkpoint (each run keeps its own norms): a
    student of unshared blocks loads as itself with no setting; a wrong explicit value names the keys."""
    config = dataclasses.replace(TINY_LCLIP, repeats=repeats)
    torch.manual_seed(4)
    student = LClip(config).eval()
    path = tmp_path / f"r{repeats}.ckpt"
    torch.save({"state_dict": {f"student.{k}": v for k, v in student.state_dict().items()}}, path)
    model = load_reward_model(RewardModelSpec(kind="lclip", weights=str(path)))
    assert model.module.config == config
    tokens = torch.randint(1, 400, (2, 9))
    assert torch.allclose(model.module.encode_text(tokens), student.encode_text(tokens), atol=1e-6)
    wrong = 2 if repeats != 2 else 1
    with pytest.raises(DataError, match=str(path)):
        load_reward_model(RewardModelSpec(kind="lclip", weights=str(path), repeats=wrong))


def test_bad_checkpoints_name_the_keys(tmp_path):
    state = clip_state(0)
    torch.save({**state, "surprise.weight": torch.zeros(1)}, tmp_path / "extra.pt")
    with pytest.raises(DataError, match=r"unexpected keys surprise\.weight"):
        load_reward_model(RewardModelSpec(arch=TINY_ARCH, weights=str(tmp_path / "extra.pt")))
    torch.save({k: v for k, v in state.items() if k != "ln_final.bias"}, tmp_path / "missing.pt")
    with pytest.raises(DataError, match=r"missing keys ln_final\.bias"):
        load_reward_model(RewardModelSpec(arch=TINY_ARCH, weights=str(tmp_path / "missing.pt")))
    save_open_clip(tmp_path / "ok.safetensors")
    with pytest.raises(ConfigError, match="77 text positions.*context_length 100"):
        load_reward_model(RewardModelSpec(arch=TINY_ARCH, weights=str(tmp_path / "ok.safetensors"), context_length=100))
    torch.save(state, tmp_path / "no_res.pt")
    with pytest.raises(DataError, match="positional_embedding_res"):
        load_reward_model(RewardModelSpec(kind="longclip", weights=str(tmp_path / "no_res.pt")))
    longclip = save_longclip(tmp_path / "spec.pt")
    with pytest.raises(ConfigError, match="248 text positions.*context_length 77"):
        load_reward_model(RewardModelSpec(kind="longclip", weights=str(longclip), context_length=77))
    for heads, message in ((torch.tensor(3), "text_heads 3 does not divide the text tower's width 128"),
                            (torch.tensor(0), "text_heads 0 does not divide the text tower's width 128"),
                            (torch.tensor([4, 4]), "text_heads holds 2 values")):
        torch.save({**torch.load(longclip, weights_only=True), HEADS_KEY: heads}, tmp_path / "odd_heads.pt")
        with pytest.raises(DataError, match=f"odd_heads.pt: {message}"):
            load_reward_model(RewardModelSpec(kind="longclip", weights=str(tmp_path / "odd_heads.pt")))
    broken = torch.load(longclip, weights_only=True)
    del broken["transformer.resblocks.0.ln_1.weight"]
    torch.save(broken, tmp_path / "broken_spec.pt")
    with pytest.raises(DataError, match=r"transformer\.resblocks\.0\.ln_1\.weight"):
        load_reward_model(RewardModelSpec(kind="longclip", weights=str(tmp_path / "broken_spec.pt")))
    lclip, _ = save_lclip(tmp_path / "lclip.ckpt")
    ckpt = torch.load(lclip, weights_only=True)
    del ckpt["state_dict"]["student.text_encoder.ln_final.weight"]
    torch.save(ckpt, tmp_path / "lclip_missing.ckpt")
    with pytest.raises(DataError, match=r"missing keys text_encoder\.ln_final\.weight"):
        load_reward_model(RewardModelSpec(kind="lclip", weights=str(tmp_path / "lclip_missing.ckpt"), heads=2))
    with pytest.raises(ConfigError, match="unknown reward model kind"):
        load_reward_model(RewardModelSpec(kind="blip"))  # type: ignore[arg-type]


def test_loading_a_model_leaves_the_random_stream_alone(tmp_path):
    """A metric model loaded by an SCST run must not change which captions the run samples."""
    weights = save_open_clip(tmp_path / "clip.safetensors")
    lclip, _ = save_lclip(tmp_path / "lclip.ckpt")
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    load_reward_model(RewardModelSpec(arch=TINY_ARCH, weights=str(weights)))
    load_reward_model(RewardModelSpec(kind="lclip", weights=str(lclip)))
    assert torch.equal(torch.rand(4), expected)
