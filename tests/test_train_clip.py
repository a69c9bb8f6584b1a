"""The world CLIP: trained offline, loaded back through the user path, then used as an SCST reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from captioner import train as train_cli
from features.clip_models.factory import clip_text_forward
from features.clip_models.open_clip_models import load_open_clip
from features.world import lexicon
from plumbing.errors import DataError
from rewards import train_clip
from rewards.recipes import clip as clip_recipe
from rewards.recipes.loop import PairEncoder, length_groups
from tests.captioner_fixtures import prepare_tiny_data, tiny_config
from tests.clip_fixtures import TINY_ARCH, write_embeds


@pytest.fixture(scope="module")
def world_clip(tiny_world, tmp_path_factory):
    out = tmp_path_factory.mktemp("world_clip") / "world_clip.safetensors"
    code = train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                            "--out", str(out), "--epochs", "2", "--set", "batch_size=16", "--set", "workers=0"])
    assert code == 0
    return out


def test_world_clip_trains_reports_recall_and_loads_by_path(world_clip):
    summary = json.loads(world_clip.with_suffix(".json").read_text())
    val = summary["val"]
    assert val["val_short_chance"] == pytest.approx(1 / 12)
    assert 0 <= val["val_short_i2t_r1"] <= 1 and 0 <= val["val_long_t2i_r1"] <= 1
    lines = world_clip.with_suffix(".metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
    assert not world_clip.with_name(world_clip.name + ".state").exists()
    loaded = load_open_clip(TINY_ARCH, str(world_clip))
    assert loaded.source == str(world_clip)
    from safetensors.torch import load_file

    saved = load_file(str(world_clip))
    assert all(torch.equal(loaded.model.state_dict()[k], v) for k, v in saved.items())


def test_a_finished_model_is_reused_only_with_the_same_settings(tiny_world, world_clip, capsys):
    base = ["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world), "--out",
            str(world_clip), "--epochs", "2", "--set", "batch_size=16"]
    before = world_clip.read_bytes()
    assert train_clip.main([*base, "--workers", "1"]) == 0  # workers do not change the weights
    assert "already trained" in capsys.readouterr().out
    assert train_clip.main([*base, "--lr", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "trained with other settings" in err and "lr: 0.001 -> 0.01" in err and str(world_clip) in err
    assert world_clip.read_bytes() == before


def _finished_model_with_an_older_summary(tiny_world, world_clip, capsys, edit, changed_flags, message):
    """The module's model, its summary edited as an older release wrote it: still finished as it is, and
    a changed setting is named. The summary is put back for the module's other tests."""
    summary_path = world_clip.with_suffix(".json")
    written = summary_path.read_text()
    summary = json.loads(written)
    edit(summary["config"])
    summary_path.write_text(json.dumps(summary))
    base = ["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world), "--out",
            str(world_clip), "--epochs", "2", "--set", "batch_size=16"]
    try:
        assert train_clip.main(base) == 0
        assert "already trained" in capsys.readouterr().out
        assert train_clip.main([*base, *changed_flags]) == 2
        assert message in capsys.readouterr().err
    finally:
        summary_path.write_text(written)


def test_a_setting_newer_than_the_finished_model_counts_as_its_default(tiny_world, world_clip, capsys):
    def before_the_option(config: dict) -> None:
        del config["world"]["text_other_frames"]

    _finished_model_with_an_older_summary(tiny_world, world_clip, capsys, before_the_option,
                                          ["--set", "world.text_other_frames=0.25"], "text_other_frames: 0.0 -> 0.25")


def test_a_model_finished_before_the_world_section_is_still_finished(tiny_world, world_clip, capsys):
    """Summaries written when the world's options sat at the top level compare with today's `world:`."""
    def before_the_section(config: dict) -> None:
        config.update(config.pop("world"))

    _finished_model_with_an_older_summary(tiny_world, world_clip, capsys, before_the_section,
                                          ["--text-lr", "0.01"], "text_lr: 0.0005 -> 0.01")


def test_help_lists_the_world_section_apart_and_a_flat_world_key_is_pointed_into_it(tiny_world, tmp_path, capsys):
    with pytest.raises(SystemExit):
        train_clip.main(["--help"])
    text = capsys.readouterr().out
    general, world = text.split("\noptions:\n")[1].split("\nworld options:\n")
    assert "--negatives" in general and "--text-edits" in general and "--init" in general
    for flag in ("--vision-pretrain-epochs", "--noun-loss", "--text-roles-epochs", "--mirror", "--image-negatives"):
        assert flag in world and flag not in general, flag
    config = tmp_path / "flat.yaml"
    config.write_text(f"dataset: {tiny_world / 'dataset.json'}\nimages_root: {tiny_world}\n"
                      f"out: {tmp_path / 'x.safetensors'}\nnoun_loss: 1.0\n")
    assert train_clip.main(["--config", str(config)]) == 2
    assert "config key 'noun_loss' belongs in the 'world' section: world.noun_loss" in capsys.readouterr().err
    assert not (tmp_path / "x.safetensors").exists()


def test_train_clip_bad_input(tiny_world, tmp_path, capsys):
    for setting, message in (("world.image_negatives=world", "image_negatives: world needs 'scenes'"),
                             ("world.vision_pretrain_epochs=2", "vision_pretrain_epochs needs 'scenes'"),
                             ("world.vision_map_labels=1.0", "set world.vision_pretrain_epochs too"),
                             ("world.phrase_loss=1.0", "phrase_loss needs 'scenes'"),
                             ("world.noun_loss=1.0", "noun_loss needs 'scenes'"),
                             ("world.noun_targets=present", "noun_targets"),
                             ("world.relation_loss=1.0", "relation_loss needs 'scenes'"),
                             ("world.phrase_attributes=[size,pattern,shape]", "phrase_attributes: unknown ['pattern']"),
                             ("world.phrase_attributes=[size,color]", "phrase_attributes: shape is missing")):
        assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                                "--out", str(tmp_path / "x.safetensors"), "--set", setting]) == 2, setting
        assert message in capsys.readouterr().err
    assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                            "--out", str(tmp_path / "x.safetensors"), "--scenes", str(tiny_world / "scenes.json"),
                            "--set", "world.relation_loss=1.0", "--set", "world.mirror=random"]) == 2
    assert "cannot be used with world.mirror" in capsys.readouterr().err
    assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                            "--out", str(tmp_path / "x.pt")]) == 2
    assert train_clip.main(["--dataset", str(tmp_path / "none.json"), "--images-root", str(tiny_world),
                            "--out", str(tmp_path / "x.safetensors")]) == 2


def test_scst_with_clip_s_alone_end_to_end(tiny_world, world_clip, tmp_path):
    data = prepare_tiny_data(tiny_world, tmp_path)
    embeds = write_embeds(tiny_world, f"open_clip:{TINY_ARCH}", world_clip, tmp_path / "embeds" / "clip.h5")
    reward_models = {"clip": {"arch": TINY_ARCH, "weights": str(world_clip), "embeds": str(embeds)}}
    xe = tiny_config(data, tmp_path, name="xe", train={"epochs": 1})
    assert train_cli.main(["--config", str(xe), "--no-progress"]) == 0
    scst = tiny_config(data, tmp_path, name="scst_clip", train={"epochs": 1, "stage": "scst", "log_every": 1},
                       optim={"lr": 1e-4, "warmup_steps": 0},
                       scst={"rewards": {"clip_s": 1.0}, "k": 3,
                             "init_from": str(tmp_path / "xe" / "checkpoints" / "last")},
                       eval={"metrics": ["cider", "clip_s", "ref_clip_s"], "select_by": "clip_s"},
                       reward_models=reward_models)
    assert train_cli.main(["--config", str(scst), "--no-progress"]) == 0
    record = json.loads((tmp_path / "scst_clip" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["stage"] == "scst" and 0 <= record["clip_s"] <= 2.5 and "ref_clip_s" in record
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "scst_clip" / "tensorboard")).Reload()
    assert "train/reward/clip_s/mean" in set(events.Tags()["scalars"])
    # a CLIP reward without its model is a config error naming the missing section
    assert train_cli.main(["--config", str(scst), "--set", "reward_models={}"]) == 2


def test_interrupted_training_resumes_to_the_same_weights(tiny_world, tmp_path, monkeypatch, capsys):
    """With hard text and image negatives after a finished pretraining stage: what each image gets
    in an epoch is seeded by (seed, epoch, row), so the resumed run draws the same negatives, and
    the finished stage's weights come back from its state."""
    from safetensors.torch import load_file

    def run(out, interrupt_at: int | None = None):
        calls = {"n": 0}
        real = clip_recipe.evaluate_retrieval

        def evaluate(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == interrupt_at:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(clip_recipe, "evaluate_retrieval", evaluate)
        return train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                                "--out", str(out), "--epochs", "3", "--set", "batch_size=16", "--set", "workers=0",
                                "--scenes", str(tiny_world / "scenes.json"), "--negatives", "world",
                                "--set", "world.image_negatives=world", "--set", "world.vision_pretrain_epochs=1",
                                "--set", "world.scene_label_loss=0.5", "--set", "locked_image_epochs=1"])

    assert run(tmp_path / "once.safetensors") == 0
    assert run(tmp_path / "twice.safetensors", interrupt_at=2) == 130  # stopped during epoch 3 (the locked one has
    # no report), after the locked stage: its weights come back from its state and the image tower trains again
    assert (tmp_path / "twice.safetensors.state").is_dir() and not (tmp_path / "twice.safetensors").exists()
    state = tmp_path / "twice.safetensors.state" / "vision" / "recipe.json"
    kept = state.read_text()
    state.write_text('{"epochs_done": ')  # a torn state file is named, with the way out, not a JSON traceback
    assert run(tmp_path / "twice.safetensors") == 2
    assert "recipe.json: unreadable resume state" in capsys.readouterr().err
    state.write_text(kept)
    assert run(tmp_path / "twice.safetensors") == 0
    once, twice = load_file(str(tmp_path / "once.safetensors")), load_file(str(tmp_path / "twice.safetensors"))
    assert all(torch.equal(once[k], twice[k]) for k in once)
    logged = [json.loads(line) for line in (tmp_path / "once.metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in logged] == ["vision", "clip_locked", "clip", "clip"]
    assert all(r["negatives"] > 1.5 and r["image_negatives"] > 0.9 for r in logged[1:]), logged  # both kinds used
    assert all(r["scene_labels"] > 0 for r in logged[1:])  # the pretraining head, restored from its stage


def test_two_processes_give_the_loss_curve_of_one(tiny_world, tmp_path):
    """Two CPU processes (gloo) with 8 images each against one with the 16-image global batch: the
    contrastive loss sees the gathered global batch, so the curves agree to 1e-4. With mirrored
    twins and hard text and image negatives, so the caption ids that keep twins apart and the
    image negatives each process draws agree across processes too."""
    import yaml

    from tests.captioner_fixtures import launch_two_processes

    def config(name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "dataset": str(tiny_world / "dataset.json"), "images_root": str(tiny_world), "epochs": 3,
            "batch_size": 16, "workers": 0, "out": str(tmp_path / f"{name}.safetensors"),
            "scenes": str(tiny_world / "scenes.json"), "negatives": "world", "hard_negatives": 2,
            "world": {"mirror": "pairs", "mirror_axes": ["horizontal", "vertical"], "image_negatives": "world"}}))
        return path

    assert train_clip.main(["--config", str(config("one"))]) == 0
    result = launch_two_processes(config("two"), "rewards.train_clip")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    def curve(name: str) -> list[float]:
        lines = (tmp_path / f"{name}.metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["train_loss"] for line in lines]

    one, two = curve("one"), curve("two")
    assert len(one) == len(two) == 3
    assert all(abs(a - b) < 1e-4 for a, b in zip(one, two, strict=True)), (one, two)


def test_pool_position_std_redraws_the_resnet_pool_positions_and_is_refused_elsewhere(tiny_world, tmp_path, capsys):
    from safetensors.torch import load_file

    base = ["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world), "--epochs", "1",
            "--set", "batch_size=16", "--set", "workers=0", "--set", "pool_position_std=2.0"]
    out = tmp_path / "rn.safetensors"
    assert train_clip.main([*base, "--arch", "world-clip-rn", "--out", str(out)]) == 0
    positions = load_file(str(out))["visual.attnpool.positional_embedding"]
    assert 1.8 < float(positions.std()) < 2.2  # open_clip's own draw has std 1/sqrt(1024) = 0.03
    assert train_clip.main([*base, "--out", str(tmp_path / "vit.safetensors")]) == 2  # a ViT has no pool
    assert "needs a ResNet vision tower" in capsys.readouterr().err
    assert train_clip.main([*base, "--arch", "world-clip-rn", "--init", str(out), "--out",
                            str(tmp_path / "again.safetensors")]) == 2
    assert "use it without 'init'" in capsys.readouterr().err


def test_lock_image_tower_keeps_the_image_tower_as_it_starts(tiny_world, tmp_path):
    """LiT: from a trained ResNet CLIP, every image-tower tensor (batch-norm statistics included)
    comes out as it went in, while the text tower trains."""
    from safetensors.torch import load_file

    base = ["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world), "--epochs", "1",
            "--arch", "world-clip-rn", "--set", "batch_size=16", "--set", "workers=0"]
    start = tmp_path / "start.safetensors"
    assert train_clip.main([*base, "--out", str(start)]) == 0
    locked = tmp_path / "locked.safetensors"
    assert train_clip.main([*base, "--init", str(start), "--out", str(locked), "--set", "lock_image_tower=true"]) == 0
    before, after = load_file(str(start)), load_file(str(locked))
    visual = [k for k in before if k.startswith("visual.")]
    assert any("running_mean" in k for k in visual)
    assert all(torch.equal(before[k], after[k]) for k in visual)
    assert not torch.equal(before["token_embedding.weight"], after["token_embedding.weight"])
    assert train_clip.main([*base, "--out", str(tmp_path / "random.safetensors"),
                            "--set", "lock_image_tower=true"]) == 2  # nothing to keep: refused


def test_locked_image_epochs_lock_the_image_tower_for_the_first_epochs_only(tiny_world, tmp_path, capsys,
                                                                           monkeypatch):
    """The locked epochs leave every image-tower tensor as it came in; the epochs after them train it
    again, drawing the data's next epochs (not the locked ones' texts a second time)."""
    from safetensors.torch import load_file

    from rewards.recipes.data import TextsDataset

    drawn: list[int] = []
    real_set_epoch = TextsDataset.set_epoch

    def set_epoch(self, epoch: int) -> None:
        drawn.append(epoch)
        real_set_epoch(self, epoch)

    monkeypatch.setattr(TextsDataset, "set_epoch", set_epoch)

    base = ["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
            "--arch", "world-clip-rn", "--set", "batch_size=16", "--set", "workers=0"]
    start = tmp_path / "start.safetensors"
    assert train_clip.main([*base, "--epochs", "1", "--out", str(start)]) == 0
    before = load_file(str(start))
    visual = [k for k in before if k.startswith("visual.")]
    for epochs, trained in ((1, False), (2, True)):
        out = tmp_path / f"locked{epochs}.safetensors"
        drawn.clear()
        assert train_clip.main([*base, "--epochs", str(epochs), "--init", str(start), "--out", str(out),
                                "--set", "locked_image_epochs=1"]) == 0
        assert sorted(set(drawn)) == list(range(epochs))  # the joint epoch draws epoch 1's texts, not epoch 0's
        after = load_file(str(out))
        assert all(torch.equal(before[k], after[k]) for k in visual) is not trained, epochs
        assert not torch.equal(before["token_embedding.weight"], after["token_embedding.weight"])
    logged = [json.loads(line) for line in (tmp_path / "locked2.metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in logged] == ["clip_locked", "clip"]
    cfg = clip_recipe.TrainClipConfig(epochs=10, locked_image_epochs=3)
    (locked, first), (free, second) = clip_recipe.contrastive_stages(cfg)
    assert (first, locked.epochs, locked.schedule, locked.first_epoch) == (True, 3, "constant", 0)
    assert (second, free.epochs, free.schedule, free.first_epoch) == (False, 7, "cosine", 3)
    too_many, both = ["locked_image_epochs=2"], ["locked_image_epochs=1", "lock_image_tower=true"]
    for bad in (too_many, both):
        sets = [arg for key in bad for arg in ("--set", key)]
        assert train_clip.main([*base, "--epochs", "1", "--init", str(start), "--out", str(tmp_path / "bad.st"),
                                *sets]) == 2
        assert "locked_image_epochs" in capsys.readouterr().err


def test_eval_every_skips_reports_but_not_training(tiny_world, tmp_path):
    """Fewer val reports change the log, never the weights: a finished run is reused whatever
    eval_every says."""
    from safetensors.torch import load_file

    def run(name: str, every: int) -> Path:
        out = tmp_path / f"{name}.safetensors"
        assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                                "--out", str(out), "--epochs", "3", "--set", "batch_size=16", "--set", "workers=0",
                                "--set", f"eval_every={every}"]) == 0
        return out

    every, last = run("every", 1), run("last", 0)
    assert all(torch.equal(a, b) for a, b in zip(load_file(str(every)).values(), load_file(str(last)).values(),
                                                 strict=True))
    logged = [json.loads(line) for line in last.with_suffix(".metrics.jsonl").read_text().splitlines()]
    assert ["val_short_i2t_r1" in r for r in logged] == [False, False, True]
    assert json.loads(last.with_suffix(".json").read_text())["val"]["val_short_i2t_r1"] >= 0
    assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                            "--out", str(last), "--epochs", "3", "--set", "batch_size=16"]) == 0  # reused


def test_noun_targets_spread_over_every_word_of_the_shapes_an_image_holds(tiny_world):
    from features.clip_models.tokens import ClipTokenizer
    from features.world.scene import load_world_scenes
    from rewards.recipes.data import load_split
    from rewards.recipes.grounding import Grounding

    split = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train", None)
    scenes, _ = load_world_scenes(str(tiny_world / "scenes.json"))
    grounding = Grounding.shape_nouns(split, scenes, ClipTokenizer(77))
    assert {"disc", "discs", "crosses", "pluses", "star"} <= set(grounding.words)
    for row, image_id in enumerate(split.image_ids):
        held = {obj.shape for obj in scenes[image_id].objects}
        on = {word for word, weight in zip(grounding.words, grounding.targets[row].tolist(), strict=True) if weight}
        words = [w for shape in held for w in lexicon.SHAPES[shape]]
        expected = {*words, *map(lexicon.plural, words)}
        assert on == expected
        assert abs(float(grounding.targets[row].sum()) - 1.0) < 1e-6
    image = torch.nn.functional.normalize(torch.randn(2, 8), dim=-1)
    nouns = torch.nn.functional.normalize(torch.randn(len(grounding.words), 8), dim=-1)
    loss = grounding.loss(image, nouns, torch.tensor(0.0), torch.tensor([0, 1]))
    assert loss.ndim == 0 and float(loss) > 0
    del scenes[split.image_ids[3]]
    with pytest.raises(DataError, match=f"image id {split.image_ids[3]}"):
        Grounding.shape_nouns(split, scenes, ClipTokenizer(77))


def test_presence_targets_give_each_present_noun_its_own_softmax_against_the_absent_ones(tiny_world):
    """noun_targets: presence. Each present text's term is -log(e^l_p / (e^l_p + sum over absent e^l_a)),
    so another present text never competes with it, and the loss reaches 0 only when every present text
    stands clear of every absent one (the spread target is already at its floor when they are equal)."""
    from features.clip_models.tokens import ClipTokenizer
    from features.world.scene import load_world_scenes
    from rewards.recipes.data import load_split
    from rewards.recipes.grounding import Grounding, presence_loss

    logits = torch.tensor([[2.0, 0.5, -1.0, 1.0], [0.0, 3.0, 1.0, -2.0]], requires_grad=True)
    present = torch.tensor([[True, False, False, True], [False, True, False, False]])
    by_hand = [torch.log1p((torch.exp(logits[0, 1]) + torch.exp(logits[0, 2])) / torch.exp(logits[0, p]))
               for p in (0, 3)]
    by_hand.append(torch.log1p((torch.exp(logits[1, 0]) + torch.exp(logits[1, 2]) + torch.exp(logits[1, 3]))
                               / torch.exp(logits[1, 1])))
    loss = presence_loss(logits, present)
    assert loss.item() == pytest.approx(torch.stack(by_hand).mean().item(), rel=1e-6)
    loss.backward()
    assert float(logits.grad[0, 0]) < 0 and float(logits.grad[0, 3]) < 0  # both present texts pushed up
    assert float(logits.grad[0, 1]) > 0 and float(logits.grad[0, 2]) > 0
    apart = torch.tensor([[30.0, -30.0, -30.0, 30.0]])
    assert float(presence_loss(apart, present[:1])) < 1e-20

    split = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train", None)
    scenes, _ = load_world_scenes(str(tiny_world / "scenes.json"))
    spread = Grounding.shape_nouns(split, scenes, ClipTokenizer(77))
    presence = Grounding.shape_nouns(split, scenes, ClipTokenizer(77), targets="presence")
    assert presence.words == spread.words and torch.equal(presence.targets, spread.targets)
    several = [row for row, image_id in enumerate(split.image_ids) if len(scenes[image_id].objects) > 1][:2]
    on = presence.targets[several] > 0
    nouns = torch.nn.functional.normalize(torch.randn(len(presence.words), 8), dim=-1)
    image = torch.nn.functional.normalize(on.float() @ nouns, dim=-1)  # leans to the nouns it holds
    assert float(presence.loss(image, nouns, torch.tensor(2.0), torch.tensor(several))) < float(
        presence.loss(-image, nouns, torch.tensor(2.0), torch.tensor(several)))
    assert float(spread.loss(image, nouns, torch.tensor(2.0), torch.tensor(several))) != pytest.approx(
        float(presence.loss(image, nouns, torch.tensor(2.0), torch.tensor(several))))


def test_presence_floor_makes_cosine_zero_one_more_rival(tiny_world):
    """noun_targets: presence_floor. F-CLIPScore counts a noun under cosine 0 as nothing, so a present
    noun that ranks above the absent ones but sits under 0 still costs: the term is
    -log(e^l_p / (e^l_p + e^0 + sum over absent e^l_a))."""
    from features.clip_models.tokens import ClipTokenizer
    from features.world.scene import load_world_scenes
    from rewards.recipes.data import load_split
    from rewards.recipes.grounding import Grounding, presence_loss

    logits = torch.tensor([[-5.0, -10.0, -12.0], [4.0, -1.0, 1.0]])
    present = torch.tensor([[True, False, False], [True, False, False]])
    by_hand = [torch.log1p((1 + torch.exp(logits[r, 1]) + torch.exp(logits[r, 2])) / torch.exp(logits[r, 0]))
               for r in range(2)]
    assert presence_loss(logits, present, floor=True).item() == pytest.approx(torch.stack(by_hand).mean().item(),
                                                                              rel=1e-6)
    below_zero = presence_loss(logits[:1], present[:1], floor=True).item()
    assert below_zero > 5.0 > 100 * presence_loss(logits[:1], present[:1]).item()  # ranked first, yet under 0

    split = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train", None)
    scenes, _ = load_world_scenes(str(tiny_world / "scenes.json"))
    floored = Grounding.shape_nouns(split, scenes, ClipTokenizer(77), targets="presence_floor")
    assert floored.presence and floored.floor


def test_phrase_targets_are_the_phrases_the_world_parser_finds_true_of_the_scene(tiny_world):
    """object_phrases: an image's target is on exactly the phrases that the world parser (not the
    builder's own tables) reads as one object of its scene with all four attributes, evenly."""
    from features.clip_models.tokens import ClipTokenizer
    from features.world.parse import contradictions, parse_caption
    from features.world.scene import load_world_scenes
    from rewards.recipes.data import load_split
    from rewards.recipes.grounding import Grounding

    split = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train", None)
    scenes, _ = load_world_scenes(str(tiny_world / "scenes.json"))
    grounding = Grounding.object_phrases(split, scenes, ClipTokenizer(77))
    assert len(set(grounding.words)) == len(grounding.words) == 2 * 8 * 3 * 7
    claims = [parse_caption(text) for text in grounding.words]
    assert all(len(c.mentions) == 1 and None not in (c.mentions[0].color, c.mentions[0].size,
                                                     c.mentions[0].texture) for c in claims)
    for row, image_id in enumerate(split.image_ids):
        scene = scenes[image_id]
        true = {text for text, c in zip(grounding.words, claims, strict=True) if not contradictions(c, scene)}
        on = {text for text, weight in zip(grounding.words, grounding.targets[row].tolist(), strict=True) if weight}
        assert on == true and len(on) == len({(o.size, o.color, o.texture, o.shape) for o in scene.objects})
        torch.testing.assert_close(grounding.targets[row][grounding.targets[row] > 0],
                                   torch.full((len(on),), 1 / len(on)))
    sized = Grounding.object_phrases(split, scenes, ClipTokenizer(77), attributes=["shape", "size"])
    assert sized.words[:2] == ["a small circle", "a small square"] and len(sized.words) == 2 * 7
    sized_claims = [parse_caption(text) for text in sized.words]
    for row, image_id in enumerate(split.image_ids):
        scene = scenes[image_id]
        true = {text for text, c in zip(sized.words, sized_claims, strict=True) if not contradictions(c, scene)}
        assert true == {text for text, weight in zip(sized.words, sized.targets[row].tolist(), strict=True) if weight}


def test_relation_targets_are_the_relations_the_world_parser_finds_true_of_the_scene(tiny_world):
    """relation_phrases: where both shapes are unique in the scene (so the parser's reading is not
    ambiguous), a shape phrase is on exactly when the parser finds it true and its relation stated by
    the scene; each relation word is on as often as its inverse; one-object scenes sit out."""
    from features.clip_models.tokens import ClipTokenizer
    from features.world.parse import contradictions, match_object, parse_caption
    from features.world.scene import load_world_scenes
    from rewards.recipes.data import load_split
    from rewards.recipes.grounding import Grounding

    split = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train", None)
    scenes, _ = load_world_scenes(str(tiny_world / "scenes.json"))
    grounding = Grounding.relation_phrases(split, scenes, ClipTokenizer(77))
    assert len(set(grounding.words)) == len(grounding.words) == 4 * (8 * 8 + 7 * 7)
    shape_phrases = [(i, text, parse_caption(text)) for i, text in enumerate(grounding.words)
                     if "shape" not in text]
    assert all(len(c.mentions) == 2 and len(c.relations) == 1 for _, _, c in shape_phrases)
    checked, word_counts = 0, {relation: 0 for relation in lexicon.RELATIONS}
    for row, image_id in enumerate(split.image_ids):
        scene, target = scenes[image_id], grounding.targets[row]
        if len(scene.objects) == 1:
            assert float(target.sum()) == 0
            continue
        assert abs(float(target.sum()) - 1.0) < 1e-6
        named = {o.shape for o in scene.objects} | {o.color for o in scene.objects}
        assert [bool(c) for c in grounding.candidates[row]] == [  # the softmax runs over its own objects' pairs
            all(word in named for word in text.split() if word in lexicon.SHAPES or word in lexicon.COLORS)
            for text in grounding.words]
        assert not bool((target > 0)[~grounding.candidates[row]].any())
        unique = {shape for shape in (o.shape for o in scene.objects)
                  if sum(o.shape == shape for o in scene.objects) == 1}
        for i, text, claims in shape_phrases:
            if {m.shape for m in claims.mentions} <= unique:
                subject, relation, other = claims.relations[0]
                a, b = (match_object(claims.mentions[k], scene) for k in (subject, other))
                true = not contradictions(claims, scene) and scene.holds(a.id, relation, b.id)
                assert bool(target[i] > 0) == true, (image_id, text)
                checked += 1
        for i, text in enumerate(grounding.words):
            if target[i] > 0:
                word_counts[next(r for r in lexicon.RELATIONS if lexicon.RELATION_PHRASES[r][0] in text)] += 1
    assert checked > 100
    assert word_counts["left of"] == word_counts["right of"] and word_counts["above"] == word_counts["below"]
    image = torch.nn.functional.normalize(torch.randn(2, 8), dim=-1)
    texts = torch.nn.functional.normalize(torch.randn(len(grounding.words), 8), dim=-1)
    one_object = [row for row, image_id in enumerate(split.image_ids) if len(scenes[image_id].objects) == 1]
    assert float(grounding.loss(image[:1], texts, torch.tensor(0.0), torch.tensor(one_object[:1]))) == 0
    several = [row for row, image_id in enumerate(split.image_ids) if len(scenes[image_id].objects) > 1][:2]
    loss = float(grounding.loss(image, texts, torch.tensor(0.0), torch.tensor(several)))
    assert 0 < loss < float("inf")  # masked-out texts leave no -inf behind


def test_noun_and_phrase_losses_train_and_are_logged(tiny_world, tmp_path):
    out = tmp_path / "nouns.safetensors"
    assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                            "--out", str(out), "--epochs", "2", "--scenes", str(tiny_world / "scenes.json"),
                            "--set", "batch_size=16", "--set", "workers=0", "--set", "world.noun_loss=1.0",
                            "--set", "world.noun_targets=presence", "--set", "world.phrase_loss=0.5",
                            "--set", "world.relation_loss=0.5", "--set", "eval_every=0"]) == 0
    logged = [json.loads(line) for line in out.with_suffix(".metrics.jsonl").read_text().splitlines()]
    for key in ("noun_loss", "phrase_loss", "relation_loss"):
        assert all(r[key] > 0 for r in logged)
        assert logged[-1][key] < logged[0][key]
    load_open_clip(TINY_ARCH, str(out))


def test_scene_labels_kept_through_the_contrastive_stage_continue_the_pretraining_head(tiny_world, tmp_path, capsys):
    """scene_label_loss: the contrastive stage goes on training the scene-label stage's head and
    tower (its loss starts where pretraining left it, far below a fresh head's, and keeps falling);
    the saved model is the plain open_clip state dict, without the head."""
    from safetensors.torch import load_file

    base = ["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
            "--scenes", str(tiny_world / "scenes.json"), "--set", "batch_size=16", "--set", "workers=0",
            "--set", "eval_every=0"]
    out = tmp_path / "kept.safetensors"
    assert train_clip.main([*base, "--out", str(out), "--epochs", "3", "--set", "world.vision_pretrain_epochs=4",
                            "--set", "lr=0.01", "--set", "world.scene_label_loss=1.0"]) == 0
    logged = [json.loads(line) for line in out.with_suffix(".metrics.jsonl").read_text().splitlines()]
    vision, clip = logged[:4], logged[4:]
    assert [r["stage"] for r in clip] == ["clip"] * 3
    assert clip[0]["scene_labels"] < vision[0]["train_loss"] / 2 and clip[-1]["scene_labels"] < clip[0]["scene_labels"]
    assert set(load_file(str(out))) == set(load_open_clip(TINY_ARCH).model.state_dict())
    background = tmp_path / "background.safetensors"  # the background's five bits alone: a far smaller loss
    assert train_clip.main([*base, "--out", str(background), "--epochs", "2", "--set", "world.vision_pretrain_epochs=4",
                            "--set", "lr=0.01", "--set", "world.scene_label_loss=1.0",
                            "--set", "world.scene_label_groups=[background]"]) == 0
    kept = [json.loads(line) for line in background.with_suffix(".metrics.jsonl").read_text().splitlines()][4:]
    assert 0 < kept[0]["scene_labels"] < clip[0]["scene_labels"] / 10
    for settings, message in ((["--set", "world.scene_label_loss=1.0"], "set world.vision_pretrain_epochs"),
                              (["--set", "world.scene_label_groups=[background,shapes]"], "unknown group 'shapes'"),
                              (["--set", "world.scene_label_loss=1.0", "--set", "world.vision_pretrain_epochs=1",
                                "--set", "lock_image_tower=true"], "which lock_image_tower keeps"),
                              (["--set", "world.scene_label_loss=1.0", "--set", "world.vision_pretrain_epochs=1",
                                "--set", "world.mirror=random"], "scene_label_loss reads relations and places off")):
        assert train_clip.main([*base, "--out", str(tmp_path / "x.safetensors"), *settings]) == 2, settings
        assert message in capsys.readouterr().err


def test_map_labels_name_what_is_centred_at_each_place_and_train_the_tower(tiny_world, tmp_path):
    """vision_map_labels: each place of the tower's last map (here a ViT's 8x8 patch grid) is
    labelled with the shape, colour, (shape, colour), size and texture of the objects centred in it;
    the pretraining stage learns them (its map loss falls) and the model loads as before."""
    from features.world.scene import load_world_scenes
    from rewards.recipes.feature_maps import last_map_shape
    from rewards.recipes.scene_labels import PER_PLACE, map_label

    scenes, _ = load_world_scenes(str(tiny_world / "scenes.json"))
    assert last_map_shape(load_open_clip(TINY_ARCH).model.visual, "x")[1] == 8
    for scene in list(scenes.values())[:10]:
        label = map_label(scene, 8)
        expected = torch.zeros_like(label)
        for obj in scene.objects:
            col, row = (min(7, int(v // (scene.image_size / 8))) for v in obj.center)
            for fact in (obj.shape, obj.color, (obj.shape, obj.color), obj.size, obj.texture):
                expected[row * 8 + col, PER_PLACE.index(fact)] = 1
        assert torch.equal(label, expected) and label.sum() >= 5
    out = tmp_path / "map.safetensors"
    assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                            "--out", str(out), "--epochs", "1", "--scenes", str(tiny_world / "scenes.json"),
                            "--set", "batch_size=16", "--set", "workers=0", "--set", "world.vision_pretrain_epochs=3",
                            "--set", "world.vision_map_labels=1.0", "--set", "eval_every=0"]) == 0
    logged = [json.loads(line) for line in out.with_suffix(".metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in logged] == ["vision"] * 3 + ["clip"]
    assert logged[2]["map_loss"] < logged[0]["map_loss"]
    load_open_clip(TINY_ARCH, str(out))


def test_texts_grouped_by_length_encode_as_one_padded_batch_does():
    """The recipes' text forward groups texts of similar length and trims each group's padding: the
    embeddings are those of one padded batch (padding is invisible under the causal mask), and a
    batch of short references with a few long captions is padded to well under 4 groups' 1.8x."""
    torch.manual_seed(0)
    model = load_open_clip(TINY_ARCH).model.eval()
    lengths = [int(n) for n in torch.randint(3, 20, (90,))] + [int(n) for n in torch.randint(40, 77, (10,))]
    tokens = torch.zeros(len(lengths), 77, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(1, 49000, (n,))
        tokens[row, n - 1] = 49407  # the EOT, the highest id, is the pooled row
    with torch.no_grad():
        grouped = PairEncoder(model, clip_text_forward(model))._texts(tokens)
        whole = clip_text_forward(model)(tokens)
    assert torch.allclose(grouped, whole, atol=1e-5)

    grouped_rows = length_groups(torch.tensor(lengths))
    groups = [rows for rows, _ in grouped_rows]
    assert sorted(int(r) for g in groups for r in g) == list(range(len(lengths)))  # every text once
    maxima = [max(lengths[int(r)] for r in g) for g in groups]
    assert maxima == sorted(maxima) == [longest for _, longest in grouped_rows]
    padded = sum(m * len(g) for m, g in zip(maxima, groups, strict=True))
    assert padded <= 1.35 * sum(lengths), (padded, sum(lengths))
    assert [(g.tolist(), longest) for g, longest in length_groups(torch.tensor([7]))] == [([0], 7)]


def test_the_foil_table_describes_the_saved_weights(tiny_world, tmp_path, monkeypatch):
    """The world-foil table a run ends with is measured in eval mode (batch norms on their running
    statistics, not on a batch of val images), so it is what the saved weights score loaded back."""
    from features.clip_models.tokens import ClipTokenizer
    from rewards.recipes.data import load_split

    measured = clip_recipe.foil_accuracy
    modes = []

    def spy(encode_image, *args, **kwargs):
        modes.append(encode_image.__self__.training)
        return measured(encode_image, *args, **kwargs)

    monkeypatch.setattr(clip_recipe, "foil_accuracy", spy)
    out, scenes = tmp_path / "rn.safetensors", str(tiny_world / "scenes.json")
    assert train_clip.main(["--dataset", str(tiny_world / "dataset.json"), "--images-root", str(tiny_world),
                            "--arch", "world-clip-rn", "--scenes", scenes, "--epochs", "1", "--out", str(out),
                            "--set", "batch_size=16", "--set", "workers=0"]) == 0
    assert modes == [False]
    loaded = load_open_clip("world-clip-rn", str(out))
    val = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "val")
    again = measured(loaded.model.encode_image, clip_text_forward(loaded.model),
                     ClipTokenizer(int(loaded.model.context_length)), val, loaded.preprocess, scenes, "clip_s",
                     torch.device("cpu"))
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["world_foils"] == again.rendered
    assert summary["reference_foils"] == again.references
    assert summary["reference_foil_counts"] == again.reference_counts


def test_the_references_table_judges_each_foil_against_its_own_image(tiny_world):
    """The references' table pairs every foil with its own image and caption, skips the fields a
    foil lacks, and counts ties as one half. A stand-in model that embeds each image's true caption
    on its image's axis, every foil half-way off it, and place foils exactly on it, must score 1
    on every kind but place (0.5), and its mean must be the mean of the kinds."""
    from features.clip_models.tokens import ClipTokenizer
    from features.world.foils import reference_foils
    from features.world.scene import load_scenes
    from rewards.recipes.data import load_split
    from rewards.recipes.foil_report import _accuracy, judge_foils

    val = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "val")
    scenes = load_scenes(str(tiny_world / "scenes.json"))
    captions = {i: (s, lo) for i, s, lo in zip(val.image_ids, val.short, val.long, strict=True)}
    items = reference_foils(scenes, captions, val.image_ids, seed=2)
    for item in items[::3]:  # some items without a long caption, as when a dataset has none
        item.pop("long_caption", None)
    tokenizer, n = ClipTokenizer(248), len(items)
    prefix = "A photo depicts "
    meaning = {}
    for row, item in enumerate(items):
        for field in ("caption", "long_caption"):
            if field in item:
                meaning[prefix + item[field]] = (row, 0.0)
            for foil in item["foils"]:
                if field in foil:
                    meaning[prefix + foil[field]] = (row, 0.0 if foil["kind"] == "place" else 1.0)
    by_ids = {tuple(tokenizer.ids([text])[0]): value for text, value in meaning.items()}

    def encode_text(tokens: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(tokens), n + 1)
        for k, row_ids in enumerate(tokens.tolist()):
            row, off = by_ids[tuple(i for i in row_ids if i)]
            out[k, row], out[k, n] = 1.0, off
        return out

    judged = judge_foils(torch.eye(n, n + 1), encode_text, tokenizer, items, "clip_s", torch.device("cpu"))
    expected = sum(len([f for f in it["foils"] if field in f]) for it in items for field in ("caption", "long_caption")
                   if field in it)
    assert len(judged) == expected and {j.captions for j in judged} == {"short", "long"}
    accuracy, counts = _accuracy(judged)
    assert sum(counts[label]["all"] for label in counts) == len(judged)
    assert counts["long"] == {kind: sum(1 for j in judged if j.captions == "long" and j.kind == kind)
                              for kind in counts["long"] if kind != "all"} | {"all": counts["long"]["all"]}
    for label, by_kind in accuracy.items():
        kinds = [k for k in by_kind if k not in ("all", "mean")]
        assert by_kind["mean"] == pytest.approx(sum(by_kind[k] for k in kinds) / len(kinds))
        assert all(by_kind[k] == (0.5 if k == "place" else 1.0) for k in kinds), (label, by_kind)
    assert "place" in accuracy["short"] and len(accuracy["short"]) >= 8
