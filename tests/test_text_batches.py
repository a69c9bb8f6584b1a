"""Texts that share a prefix run it once: the same embeddings and gradients as the plain forward."""

from __future__ import annotations

import json
import random

import torch

from features.clip_models.factory import clip_text_forward
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.text_batches import (
    MIN_SHARED,
    PrefixTree,
    _Packing,
    prefix_tree,
    shared_prefix_text_forward,
)
from features.clip_models.tokens import ClipTokenizer
from features.world.negatives import hard_negatives
from features.world.scene import load_world_scenes
from rewards.recipes.loop import PairEncoder
from tests.clip_fixtures import TINY_ARCH

EOT = 49407


def _world_batch(world, tokenizer: ClipTokenizer, per_image: int = 5) -> tuple[torch.Tensor, list[str]]:
    """Each image's long caption or first reference, a prefix of it (as SPECS's triplets are) and its
    world hard negatives; missing texts are all-zero rows, as the batcher pads them."""
    data = json.loads((world / "dataset.json").read_text())
    scenes, _ = load_world_scenes(world / "scenes.json")
    rng = random.Random(0)
    texts: list[str] = []
    for k, image in enumerate(data["images"][:24]):
        caption = image["long_captions"][0]["raw"] if k % 2 else image["sentences"][0]["raw"]
        prefix = " ".join(caption.split()[: max(4, len(caption.split()) // 2)])
        negatives = [n.text for n in hard_negatives(caption, scenes[image["imgid"]], rng, per_image - 2)]
        texts += [caption, prefix, *negatives] + [""] * (per_image - 2 - len(negatives))
    return tokenizer.padded([tokenizer.ids([text])[0] if text else [] for text in texts]), texts


def test_shared_prefixes_embed_and_backpropagate_as_the_plain_forward(tiny_world):
    torch.manual_seed(0)
    model = load_open_clip(TINY_ARCH).model
    tokens, texts = _world_batch(tiny_world, ClipTokenizer(int(model.context_length)))
    tree = prefix_tree(tokens, 5)
    assert int((tree.parent >= 0).sum()) >= len(texts) // 2  # the test exercises the shared path
    shared_forward, plain = shared_prefix_text_forward(model), clip_text_forward(model)
    weights = torch.randn(len(tokens), model.text_projection.shape[1])
    params = [p for p in model.parameters() if p.requires_grad]

    def outputs_and_grads(forward):
        out = forward()
        return out.detach(), torch.autograd.grad((out * weights).sum(), params, allow_unused=True)

    shared_out, shared_grads = outputs_and_grads(lambda: shared_forward(tokens, tree))
    plain_out, plain_grads = outputs_and_grads(lambda: torch.cat([plain(row[None, : int(row.argmax()) + 1])
                                                                  for row in tokens]))
    assert torch.allclose(shared_out, plain_out, atol=1e-5), (shared_out - plain_out).abs().max()
    for got, want in zip(shared_grads, plain_grads, strict=True):
        if want is None:
            assert got is None or not got.any()
            continue
        scale = float(want.abs().max())  # sums over many texts: compare at the gradient's own scale
        assert float((got - want).abs().max()) <= 1e-5 * scale + 1e-7, (got - want).abs().max() / scale

    pair = PairEncoder.of_clip(model)  # the recipes' forward: no tree means every text whole
    assert torch.allclose(pair(None, tokens)[1], plain_out, atol=1e-5)


def test_the_tree_shares_leading_tokens_only_and_never_the_pooled_eot():
    caption = [49406, 10, 11, 12, 13, 14, EOT]
    rows = [caption,
            [49406, 10, 11, 12, 99, 14, EOT],       # differs at position 4
            [49406, 10, 11, 12, 13, EOT],           # a prefix of the caption: its EOT is its own
            [49406, 10, 99, 12, 13, 14, EOT],       # shares too little to be worth a gather
            [0] * 7,                                # a padded (missing) text
            caption]                                # a duplicate: everything but the EOT is shared
    tokens = torch.tensor([row + [0] * (7 - len(row)) for row in rows])
    tree = prefix_tree(tokens, block=6)
    assert tree.parent.tolist() == [-1, 0, 0, -1, -1, 0]
    assert tree.shared.tolist() == [0, 4, 5, 0, 0, 6]
    assert all(s < int(row.argmax()) + 1 for s, row in zip(tree.shared, tokens, strict=True))
    assert 2 < MIN_SHARED <= 4

    both = tree.cat(PrefixTree.roots(2))
    assert both.parent.tolist() == [-1, 0, 0, -1, -1, 0, -1, -1]
    nested = PrefixTree.roots(3).cat(tree)
    assert nested.parent.tolist()[3:] == [-1, 3, 3, -1, -1, 3]


def test_a_packed_row_is_its_root_then_each_childs_suffix():
    caption = [49406, 10, 11, 12, 13, 14, EOT]
    rows = [caption,
            [49406, 10, 11, 12, 99, 14, EOT],  # child of row 0, shares 4
            [49406, 20, 21, EOT],              # a root of its own
            [49406, 10, 11, 12, 13, EOT],      # child of row 0, shares 5
            [49406, 20, 21, 22, 23, EOT]]      # child of row 2, shares 3
    tokens = torch.tensor([row + [0] * (7 - len(row)) for row in rows])
    tree = PrefixTree(torch.tensor([-1, 0, -1, 0, 2]), torch.tensor([0, 4, 0, 5, 3]))
    packed = _Packing.of(tokens, tree.parent, tree.shared)

    assert packed.lengths.tolist() == [7 + 3 + 1, 4 + 3]
    first = packed.padded(packed.ids, torch.tensor([0, 1]), 11)
    assert first[0].tolist() == caption + [99, 14, EOT] + [EOT]
    assert first[1].tolist() == [49406, 20, 21, EOT, 22, 23, EOT] + [-1] * 4
    positions = packed.padded(packed.positions, torch.tensor([1]), 7)[0].tolist()
    assert positions == [0, 1, 2, 3, 3, 4, 5]  # the child's suffix keeps its own positions
    segments = packed.padded(packed.segments, torch.tensor([0]), 11)[0].tolist()
    assert segments == [0] * 7 + [1] * 3 + [2]
    starts = packed.padded(packed.starts, torch.tensor([0]), 11)[0].tolist()
    assert starts == [0] * 7 + [4] * 3 + [5]
    assert packed.end.tolist() == [6, 9, 3, 10, 6]  # each text's EOT in its packed row
    texts, local, slots, queries = packed.pooled_of(torch.tensor([1, 0]))  # a length group may reorder rows
    assert texts.tolist() == [2, 4, 0, 1, 3] and local.tolist() == [0, 0, 1, 1, 1]
    assert slots.tolist() == [0, 1, 0, 1, 2] and queries.tolist() == [[3, 6, 0], [6, 9, 10]]


def test_towers_it_does_not_know_keep_the_plain_forward():
    class NoTransformer(torch.nn.Module):
        pass

    assert shared_prefix_text_forward(NoTransformer()) is None
    model = load_open_clip(TINY_ARCH).model
    model.text_pool_type = "last"
    assert shared_prefix_text_forward(model) is None


def test_text_bench_times_both_forwards_and_checks_they_agree(tiny_world, tmp_path, capsys):
    from rewards import bench

    assert bench.main(["text", "--world", str(tiny_world), "--arch", TINY_ARCH, "--repeats", "1"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["bench"] == "text" and row["max_abs_diff"] < 1e-4
    assert 0 < row["tokens_run"] < row["tokens"] and row["ours_s"] > 0 and row["ref_s"] > 0
    tokenizer = row["tokenizer"]
    assert tokenizer["same_ids"] is True and tokenizer["texts"] == row["texts"]
    assert min(tokenizer["ours_s"], tokenizer["cold_s"], tokenizer["ref_s"]) > 0
    assert bench.main(["text", "--world", str(tmp_path), "--arch", TINY_ARCH]) != 0  # no world there
    assert "dataset.json: not found" in capsys.readouterr().err


def _outputs_and_grads(forward, module: torch.nn.Module) -> tuple[torch.Tensor, list]:
    out = forward()
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    params = [p for p in module.parameters() if p.requires_grad]
    return out.detach(), list(torch.autograd.grad((out * weights).sum(), params, allow_unused=True))


def _same_grads(got: list, want: list) -> None:
    for g, w in zip(got, want, strict=True):
        if w is None or g is None:
            assert (g is None or not g.any()) and (w is None or not w.any())
            continue
        scale = float(w.abs().max()) or 1.0
        assert float((g - w).abs().max()) <= 1e-5 * scale + 1e-7, (g - w).abs().max() / scale


def test_the_last_block_run_at_the_pooled_positions_alone_gives_open_clips_outputs_and_gradients(tiny_world):
    torch.manual_seed(0)
    model = load_open_clip(TINY_ARCH).model
    tokens, _ = _world_batch(tiny_world, ClipTokenizer(int(model.context_length)))
    tokens = tokens[tokens.argmax(dim=1) > 0]  # open_clip's own forward has no empty texts
    full = torch.nn.functional.pad(tokens, (0, int(model.context_length) - tokens.shape[1]))
    ours, ours_grads = _outputs_and_grads(lambda: clip_text_forward(model)(tokens), model)
    theirs, their_grads = _outputs_and_grads(lambda: model.encode_text(full), model)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    _same_grads(ours_grads, their_grads)


def test_lclip_towers_pooled_at_the_last_run_alone_match_every_position_run():
    from features.clip_models.lclip import LClip, run_blocks
    from tests.clip_fixtures import TINY_LCLIP

    torch.manual_seed(0)
    model = LClip(TINY_LCLIP)
    vision, text = model.image_encoder, model.text_encoder
    images = torch.randn(6, 3, TINY_LCLIP.image_size, TINY_LCLIP.image_size)
    ours, ours_grads = _outputs_and_grads(lambda: vision(images), vision)
    every, every_grads = _outputs_and_grads(lambda: vision.ln_post(vision.tokens(images)[:, 0]) @ vision.proj, vision)
    assert torch.allclose(ours, every, atol=1e-5), (ours - every).abs().max()
    _same_grads(ours_grads, every_grads)

    tokens = torch.zeros(5, 12, dtype=torch.long)
    for row, length in enumerate((3, 12, 7, 5, 9)):
        tokens[row, :length] = torch.randint(1, 400, (length,), generator=torch.Generator().manual_seed(row))
        tokens[row, 0], tokens[row, length - 1] = 49406, EOT

    def every_position() -> torch.Tensor:
        x = text.token_projection(text.token_embedding(tokens)) + text.positional_embedding[: tokens.shape[1]]
        x = text.ln_final(run_blocks(text.blocks, x, True))
        return x[torch.arange(len(tokens)), tokens.argmax(dim=-1)] @ text.text_projection

    ours, ours_grads = _outputs_and_grads(lambda: text(tokens), text)
    every, every_grads = _outputs_and_grads(every_position, text)
    assert torch.allclose(ours, every, atol=1e-5), (ours - every).abs().max()
    _same_grads(ours_grads, every_grads)


def test_embed_texts_runs_shortest_first_and_returns_rows_in_the_texts_order(tiny_world, monkeypatch):
    import torch.nn.functional as F

    from rewards.recipes import contrastive

    torch.manual_seed(0)
    model = load_open_clip(TINY_ARCH).model.eval()
    tokenizer = ClipTokenizer(int(model.context_length))
    _, texts = _world_batch(tiny_world, tokenizer)
    texts = [text for text in texts if text]
    forward = clip_text_forward(model)
    seen: list[int] = []

    def encode(tokens: torch.Tensor) -> torch.Tensor:
        seen.extend((tokens > 0).sum(dim=1).tolist())
        return forward(tokens)

    monkeypatch.setattr(contrastive, "CHUNK", 16)  # several chunks
    got = contrastive.embed_texts(encode, tokenizer, texts, torch.device("cpu"))
    with torch.no_grad():
        one_by_one = torch.cat([F.normalize(forward(tokenizer.padded(tokenizer.ids([text]))), dim=-1)
                                for text in texts])
    assert torch.allclose(got, one_by_one, atol=1e-5)
    assert seen == sorted(seen) and len(seen) == len(texts)
