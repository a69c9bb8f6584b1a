"""train_clip's text stage (rewards/recipes/text_stage.py): its statements are checked against the
scenes by the world parser, its role targets follow the fact, and a tiny run through all three phases
loads back by path and resumes to the same weights after an interruption."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from features.clip_models.tokens import ClipTokenizer
from features.world import lexicon
from features.world.parse import contradictions, parse_caption
from rewards import train_clip
from rewards.recipes.loop import RecipeRun
from rewards.recipes.text_stage import (
    ROLE_NAMES,
    CaptionsDataset,
    FactsDataset,
    TextItemBatcher,
    pair_terms,
    relation_facts,
    roles,
    statement_pair,
)
from tests.clip_fixtures import TINY_ARCH


def test_each_statement_is_true_of_its_scene_and_its_inverse_false(world_train):
    """By the world parser, not by the writer: the true statement contradicts nothing, the
    inverse one exactly its relation, in both wordings."""
    train, scenes = world_train
    facts = relation_facts(train, scenes)
    assert len(facts) > 20
    rng = random.Random(0)
    for fact in facts:
        scene = scenes[train.image_ids[fact.row]]
        for long_rate in (0.0, 1.0):
            true, false = statement_pair(fact, rng, long_rate)
            assert contradictions(parse_caption(true), scene) == [], true
            wrong = contradictions(parse_caption(false), scene)
            assert len(wrong) == 1 and "is not" in wrong[0], (false, wrong)


def _phrases(text: str) -> tuple[list[str], str]:
    """The relation phrases of a statement, and the statement with each one blanked."""
    found = re.findall(_RELATION_PATTERN, text)
    return found, re.sub(_RELATION_PATTERN, "<rel>", text)


_RELATION_PATTERN = "|".join(sorted((re.escape(p) for ps in lexicon.RELATION_PHRASES.values() for p in ps),
                                    key=len, reverse=True))


def test_statements_in_other_frames_state_the_fact_and_name_the_subject_otherwise(world_train):
    """`text_other_frames`: the pair differs only in its relation phrase, the fact's against its
    inverse; where the parser reads the frame the scene confirms it, and in the frames it cannot
    read the subject is not the first object named (what the option is for)."""
    train, scenes = world_train
    rng = random.Random(1)
    read, subject_later = 0, 0
    for fact in relation_facts(train, scenes):
        scene = scenes[train.image_ids[fact.row]]
        true, false = statement_pair(fact, rng, 0.0, other_frames=1.0)
        (said,), frame = _phrases(true)
        (unsaid,), other = _phrases(false)
        assert frame == other and said in lexicon.RELATION_PHRASES[fact.relation]
        assert unsaid in lexicon.RELATION_PHRASES[lexicon.INVERSE[fact.relation]]
        claims = parse_caption(true)
        if claims.relations:
            read += 1
            assert contradictions(claims, scene) == [], true
            assert any("is not" in w for w in contradictions(parse_caption(false), scene)), false
        else:
            looks = [(m.color, m.shape) for m in claims.mentions]
            assert looks == [(fact.object.color, fact.object.shape), (fact.subject.color, fact.subject.shape)], true
            subject_later += 1
    assert read and subject_later  # both kinds of frame are drawn


def test_facts_whose_inverse_a_look_alike_holds_are_left_out():
    """The world draws distinct kinds, but a user's scenes may not: with two red circles, one above
    and one below a blue star, "a red circle below a blue star" is true, so neither fact between the
    circles and the star can be a pair; the facts about the square stay, and their inverses are false."""
    from features.world.scene import Scene, WorldObject, relations_between
    from rewards.recipes.data import Split

    objects = [WorldObject(0, "circle", "red", "small", "solid", (40.0, 10.0), 6.0, "top"),
               WorldObject(1, "star", "blue", "small", "solid", (40.0, 32.0), 6.0, "center"),
               WorldObject(2, "circle", "red", "large", "solid", (40.0, 54.0), 9.0, "bottom"),
               WorldObject(3, "square", "green", "small", "solid", (8.0, 32.0), 6.0, "left")]
    relations = [{"subject": a.id, "relation": r, "object": b.id} for a in objects for b in objects
                 if a.id != b.id for r in relations_between(a, b, 64)]
    scene = Scene(64, "gray", (128, 128, 128), objects, relations)
    split = Split([7], ["unused.png"], [["a picture"]], [[]], [])
    facts = relation_facts(split, {7: scene})
    assert facts and all("square" in (f.subject.shape, f.object.shape) for f in facts)
    rng = random.Random(0)
    for fact in facts:
        true, false = statement_pair(fact, rng, 0.0)
        assert contradictions(parse_caption(true), scene) == [] and contradictions(parse_caption(false), scene)


def test_role_targets_name_who_stands_where(world_train):
    train, scenes = world_train
    fact = relation_facts(train, scenes)[0]
    target = roles(fact).view(len(ROLE_NAMES), len(lexicon.RELATIONS))
    relation, inverse = lexicon.RELATIONS.index(fact.relation), lexicon.RELATIONS.index(lexicon.INVERSE[fact.relation])
    for name in (fact.subject.color, fact.subject.shape):
        assert target[ROLE_NAMES.index(name), relation] == 1
    for name in (fact.object.color, fact.object.shape):
        assert target[ROLE_NAMES.index(name), inverse] == 1
    assert target.sum() <= 4


def test_batches_keep_one_row_per_item_and_draw_the_same_texts_again(world_train):
    train, scenes = world_train
    facts = relation_facts(train, scenes)
    captions = CaptionsDataset(train, train.pool("both"), scenes, facts, seed=3, hard=3,
                               kinds=("shape", "color", "relation"), long_rate=0.5)
    batch = TextItemBatcher(ClipTokenizer(248))([captions[row] for row in range(8)])
    assert batch["tokens"].shape[:2] == batch["mask"].shape and len(batch["rows"]) == 8
    assert batch["pair_tokens"].shape[:3] == (8, 2, 2) and batch["roles"].shape[:2] == batch["pair_mask"].shape
    assert captions[5] == captions[5]  # seeded by (seed, epoch, item)
    statements = FactsDataset(facts, seed=3, long_rate=0.5, true_only=True)
    first = statements[2]
    statements.set_epoch(1)
    assert len(first.pairs[0]) == 1 and statements[2] != first


def test_negclip_images_take_a_long_caption_at_their_share(world_train):
    """`text_long_captions`: at share 1 each image's caption (the one its hard negatives are built
    from) is one of its long captions, or from its pool when it has none; at share 0 the pool alone;
    at 0.5 about half the images over epochs."""
    train, scenes = world_train
    split = train.subset(list(range(len(train))))
    split.long[0] = []
    facts = relation_facts(split, scenes)

    def captions(share: float) -> CaptionsDataset:
        return CaptionsDataset(split, split.pool("short"), scenes, facts, seed=1, hard=2, kinds=("relation",),
                               long_rate=0.0, long_share=share)

    every, plain, half = captions(1.0), captions(0.0), captions(0.5)
    assert all(every[row].group[0] in split.long[row] for row in range(1, len(split)))
    assert every[0].group[0] in split.short[0]
    assert all(plain[row].group[0] in split.short[row] for row in range(len(split)))
    drawn = []
    for epoch in range(5):
        half.set_epoch(epoch)
        drawn += [half[row].group[0] in split.long[row] for row in range(1, len(split))]
    assert 0.35 < sum(drawn) / len(drawn) < 0.65


def test_a_batch_without_relations_still_reaches_the_role_head():
    """Images of one object hold no relation: such a batch gives a zero loss with a gradient path to
    every parameter (DDP expects one), not a NaN from an empty mean."""
    head = torch.nn.Linear(4, 6)
    role_logits = head(torch.randn(3, 2, 4))
    batch = {"pair_mask": torch.zeros(3, 2, dtype=torch.bool), "roles": torch.zeros(3, 2, 6),
             "rows": torch.arange(3)}
    loss, parts = pair_terms(torch.randn(3, 2, 2, 4), role_logits, batch, torch.randn(3, 4), torch.tensor(1.0))
    loss.backward()
    assert loss.item() == 0 and parts == {} and head.weight.grad is not None


def test_a_negclip_batch_of_one_object_images_trains(world_train):
    """Images of one object hold no relation: a negclip batch of only those has no pair rows at all
    ([B, 0, 1, L]) and its loss is NegCLIP's alone."""
    from features.clip_models.open_clip_models import load_open_clip
    from rewards.recipes.loop import PairEncoder
    from rewards.recipes.text_stage import FrozenImages, TextReader, text_stage_step

    train, scenes = world_train
    lone = [row for row, image_id in enumerate(train.image_ids) if len(scenes[image_id].objects) == 1][:4]
    assert len(lone) >= 2
    captions = CaptionsDataset(train, train.pool("short"), scenes, relation_facts(train, scenes), seed=0, hard=2,
                               kinds=("shape", "color"), long_rate=0.0)
    model = load_open_clip(TINY_ARCH, None).model
    batch = TextItemBatcher(ClipTokenizer(int(model.context_length)))([captions[row] for row in lone])
    assert batch["pair_tokens"].shape[1] == 0
    width = int(model.text_projection.shape[1])
    images = FrozenImages(torch.nn.functional.normalize(torch.randn(len(train), width), dim=-1), torch.tensor(2.0))
    reader = TextReader(PairEncoder.of_clip(model), width, seed=0)
    loss, parts = text_stage_step(images, negclip=True)(reader, batch)
    loss.backward()
    assert torch.isfinite(loss) and set(parts) == {"negclip"} and reader.role_head.weight.grad is not None


def _run(world, out, *extra):
    return train_clip.main(["--dataset", str(world / "dataset.json"), "--images-root", str(world),
                            "--scenes", str(world / "scenes.json"), "--out", str(out), "--arch", TINY_ARCH,
                            "--epochs", "1", "--negatives", "world", "--set", "batch_size=16", "--set", "workers=0",
                            "--set", "world.text_roles_epochs=1", "--set", "world.text_pairs_epochs=2",
                            "--set", "world.text_negclip_epochs=1", "--set", "world.text_batch_size=16",
                            "--set", "world.text_roles_batch_size=8",
                            "--set", "world.text_attributes=[size, place, background]",
                            "--set", "world.text_long_captions=0.5", *extra])


def test_an_interrupted_text_stage_resumes_to_the_same_weights(tiny_world, tmp_path, monkeypatch):
    """Stopped in the pairs phase's second epoch: the contrastive stage and the roles phase come back
    from their states, the role head from its seed, and the weights end bit for bit as an
    uninterrupted run's; the image tower is the contrastive stage's, untouched."""
    from safetensors.torch import load_file

    assert _run(tiny_world, tmp_path / "once.safetensors") == 0
    real_fit = RecipeRun.fit
    calls = {"pairs": 0}
    stages = {}

    def fit(self, model, dataset, collate, loss_fn, stage, *args, **kwargs):
        stages[stage.name] = (stage.schedule, stage.batch_size)

        def interrupting(module, batch):
            if stage.name == "text_pairs" and self._epochs_done("text_pairs") == 1:
                calls["pairs"] += 1
                raise KeyboardInterrupt
            return loss_fn(module, batch)

        return real_fit(self, model, dataset, collate, interrupting, stage, *args, **kwargs)

    monkeypatch.setattr(RecipeRun, "fit", fit)
    assert _run(tiny_world, tmp_path / "twice.safetensors") == 130
    assert calls["pairs"] == 1 and not (tmp_path / "twice.safetensors").exists()
    # the roles at a steady rate and their own batch size (they stall on a plateau under a decaying one)
    assert stages["text_roles"] == ("constant", 8) and stages["text_pairs"] == ("cosine", 16)
    monkeypatch.undo()
    assert _run(tiny_world, tmp_path / "twice.safetensors") == 0
    once, twice = load_file(str(tmp_path / "once.safetensors")), load_file(str(tmp_path / "twice.safetensors"))
    assert all(torch.equal(once[k], twice[k]) for k in once)
    logged = [json.loads(line) for line in (tmp_path / "once.metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in logged] == ["clip", "text_roles", "text_pairs", "text_pairs", "text_negclip"]
    assert all(0 <= r["pair_accuracy"] <= 1 for r in logged[2:]) and "negclip" in logged[-1]
    summary = json.loads((tmp_path / "once.json").read_text())
    assert set(summary["world_foils"]) == {"short", "long"}  # the foil table at the end
    assert summary["val"]["val_short_chance"] == pytest.approx(1 / 12)


def test_the_text_stage_changes_the_text_tower_only(tiny_world, tmp_path, monkeypatch):
    """From a finished CLIP with `epochs: 0`: the image tower and the temperature come out as they went in.
    The negclip phase takes its own batch size where one is given."""
    from safetensors.torch import load_file

    start = tmp_path / "start.safetensors"
    assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                            "--out", str(start), "--arch", TINY_ARCH, "--epochs", "1", "--set", "batch_size=16",
                            "--set", "workers=0"]) == 0
    out = tmp_path / "read.safetensors"
    real_fit, batch_sizes = RecipeRun.fit, {}

    def fit(self, model, dataset, collate, loss_fn, stage, *args, **kwargs):
        batch_sizes[stage.name] = stage.batch_size
        return real_fit(self, model, dataset, collate, loss_fn, stage, *args, **kwargs)

    monkeypatch.setattr(RecipeRun, "fit", fit)
    assert _run(tiny_world, out, "--set", "epochs=0", "--init", str(start),
                "--set", "world.text_negclip_batch_size=4") == 0
    assert batch_sizes == {"text_roles": 8, "text_pairs": 16, "text_negclip": 4}
    before, after = load_file(str(start)), load_file(str(out))
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("visual.") or k == "logit_scale")
    assert not all(torch.equal(before[k], after[k]) for k in before if k.startswith("transformer."))


@pytest.mark.parametrize(("settings", "message"), [
    (["--set", "epochs=0"], "epochs: 0"),
    (["--set", "world.text_pairs_axes=[diagonal]"], "text_pairs_axes"),
    (["--set", "world.text_attributes=[colour]"], "text_attributes"),
    (["--set", "world.text_long_statements=1.5"], "text_long_statements"),
    (["--set", "world.text_long_captions=1.5"], "text_long_captions"),
    (["--set", "world.text_negclip_batch_size=1"], "text_negclip_batch_size"),
])
def test_text_stage_settings_are_checked(tiny_world, tmp_path, settings, message, capsys):
    assert _run(tiny_world, tmp_path / "bad.safetensors", *settings) == 2
    assert message in capsys.readouterr().err


def test_long_captions_asked_of_a_dataset_without_them_name_the_file(tiny_world, tmp_path, capsys):
    data = json.loads((tiny_world / "dataset.json").read_text())
    for image in data["images"]:
        image.pop("long_captions", None)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data))
    code = train_clip.main(["--dataset", str(bare), "--images-root", str(tiny_world), "--scenes",
                            str(tiny_world / "scenes.json"), "--out", str(tmp_path / "x.safetensors"), "--arch",
                            TINY_ARCH, "--captions", "short", "--set", "world.text_negclip_epochs=1",
                            "--set", "world.text_long_captions=0.5"])
    err = capsys.readouterr().err
    assert code != 0 and str(bare) in err and "long captions" in err


def test_every_batch_key_must_divide_into_the_processes_before_training():
    """Each stage's batch is global: an odd `text_negclip_batch_size` under two processes is refused
    with its key named when the run starts, not when the text stage comes; null keys are skipped."""
    from plumbing.errors import ConfigError
    from rewards.recipes.clip import TrainClipConfig
    from rewards.recipes.clip_world import WorldSupervision
    from rewards.recipes.loop import check_global_batches

    def config(batch_size: int, negclip_batch_size: int | None) -> TrainClipConfig:
        world = WorldSupervision(text_negclip_batch_size=negclip_batch_size)
        return TrainClipConfig(batch_size=batch_size, world=world)

    check_global_batches(config(64, None), 2)
    check_global_batches(config(64, 63), 1)
    with pytest.raises(ConfigError, match=r"^world\.text_negclip_batch_size 63 must divide into 2"):
        check_global_batches(config(64, 63), 2)
    with pytest.raises(ConfigError, match="^batch_size 9 must divide into 4"):
        check_global_batches(TrainClipConfig(batch_size=9), 4)
