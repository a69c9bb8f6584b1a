"""L-CLIP distillation (papers/l_clipscore_paper.md §III-B) from any loadable CLIP teacher into the
L-CLIP student (features/clip_models/lclip.py: weight-multiplexed blocks, factorised token embedding):

  stage 1, per tower:  L_D = ½·|r_T − r_S|₁ + ½·(1 − cos(r_T, r_S))                    (Eq. 1)
  stage 2, adds:       L_SR = Σ_i max(0, S^T_ii − S^S_ii) + Σ_{i≠j} max(0, S^S_ij − S^T_ij)  (Eq. 2)

|·|₁ is averaged over dimensions and L_SR divided by the batch size, so the terms keep one scale
whatever the width and batch. S is the cosine similarity of the global embeddings. The student
starts from the teacher where shapes allow (patch stem, positions, norms, projections, blocks,
a truncated SVD of the token embedding). It is saved as a DistillCLIP-style checkpoint
(`state_dict` with `student.` keys) that the `lclip` loader reads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from features.clip_models.factory import clip_text_forward
from features.clip_models.lclip import LClip, LClipConfig, default_heads, heads_entry, stem_stride
from features.clip_models.longclip import text_heads
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.text_batches import prefix_tree
from features.clip_models.tokens import ClipTokenizer
from features.world.negatives import KINDS, hard_negatives
from features.world.scene import Scene, load_scenes
from plumbing.atomic import atomic_path, write_json
from plumbing.config import option, require_keys
from plumbing.errors import ConfigError
from rewards.clip.formulas import CLIP_S_PREFIX, clip_s
from rewards.recipes.contrastive import distill_loss, embed_texts, gather_with_grad, recall_at_1
from rewards.recipes.data import Split, TextBatcher, TextsDataset, cache_pixels, embed_split_images, load_split, pick
from rewards.recipes.feature_hints import EmbeddingTerms, pretrain_on_hints
from rewards.recipes.feature_maps import image_side
from rewards.recipes.foil_report import announce, foil_accuracy
from rewards.recipes.loop import PairEncoder, RecipeConfig, RecipeRun, Stage
from rewards.recipes.mirror import AXES
from rewards.recipes.scene_labels import pretrain_on_scene_labels
from rewards.recipes.training import finished_summary, summary_record


@dataclass
class DistillConfig(RecipeConfig):
    teacher: str = option("", help="teacher weights: a file, or an open_clip hub tag")
    teacher_arch: str = option("world-clip-tiny", help="the teacher's open_clip architecture")
    out: str = option("", help="output student checkpoint (.ckpt, DistillCLIP layout)")
    batch_size: int = option(128, help="images per optimizer step over all processes", at_least=2)
    lr: float = option(5e-4, help="stage 1 peak learning rate (warmup, then cosine)", above=0)
    weight_decay: float = option(0.01, help="AdamW weight decay (not on gains, biases, embeddings)", at_least=0)
    vision_layers: int = option(2, help="student image-tower layers after multiplexing (shared blocks x repeats)",
                                at_least=1)
    text_layers: int = option(2, help="student text-tower layers after multiplexing", at_least=1)
    repeats: int = option(2, help="runs of each shared block", at_least=1)
    embed_rank: int = option(32, help="factorised token embedding: vocab x rank, then rank x width", at_least=1)
    text_heads: int = option(
        0, help="student text-tower attention heads; 0 = the teacher's, so the copied blocks compute what the "
        "teacher's do (the world CLIP's four heads read as two give other texts: cosine 0.85 with the teacher's "
        "at full rank)", at_least=0)
    vision_width: int = option(0, help="student image-tower width; 0 = the teacher's (a ViT teacher)", at_least=0)
    stem_channels: list[int] = option(factory=list, help="student image tower: widths of a conv stem's first "
                                      "stride-2 convs ([] = a patch stem; needed for a non-ViT teacher)")
    stem_norm: bool = option(False, help="a BatchNorm after each of the stem's convolutions but the last")
    embed_dim: int = option(0, help="student embedding size; 0 = the teacher's (L_D compares them directly)",
                            at_least=0)
    stage1_epochs: int = option(4, help="epochs of stage 1 (L_D per tower)", at_least=0)
    stage2_epochs: int = option(2, help="epochs of stage 2 (+ the similarity regulator)", at_least=0)
    stage2_lr: float = option(1e-5, help="stage 2 learning rate, constant (the paper: 1e-4 at batch 2048)", above=0)
    stage2_freeze_text: bool = option(
        True, help="stage 2 trains the image tower only, the text tower frozen, as the paper does (its language "
        "encoder would otherwise overfit stage 2's data; here, unfrozen, one epoch moved the texts away from the "
        "teacher's: text L_D 0.07 -> 0.10)")
    sr_weight: float = option(1.0, help="weight of the similarity-regulator loss in stage 2", at_least=0)
    rank_weight: float = option(
        0.0, help="weight of a ranking term in both stages (not in the paper): per image, the student's softmax "
        "over its caption and hard negatives (at the teacher's temperature) matches the teacher's (KL). L_D "
        "matches embeddings as a whole; a changed fact moves them only a little, and this term weighs exactly "
        "that move", at_least=0)
    negatives: Literal["none", "world"] = option("none", help="also distil on hard text negatives: none or world")
    hard_negatives: int = option(2, help="hard negatives per image and step (with negatives: world)", at_least=0)
    vision_pretrain_epochs: int = option(
        0, help="epochs of supervised pretraining of the student's image tower on the world's scene graphs "
        "(`scenes`, train split) before stage 1, as train_clip's option of that name: the student then starts "
        "from a tower that already sees shapes, which L_D alone does not teach it", at_least=0)
    hint_epochs: int = option(
        0, help="epochs in which the student's image tower learns to predict the teacher's last feature map, "
        "place by place (FitNets hints; rewards/recipes/feature_hints.py), before stage 1 and after the scene "
        "labels", at_least=0)
    embed_init: Literal["all", "used"] = option(
        "all", help="the factorised token embedding starts at the truncated SVD of the teacher's whole table "
        "(all) or of the rows the train captions use, weighted by use (used); see init_from_teacher")
    hint_embedding_weight: float = option(
        0.0, help="in the hints stage, weight of L_D between the student's image embedding and the teacher's (image "
        "side only, so the stage stays cheap: the teacher's embeddings are computed once), besides the maps "
        "(0: off)", at_least=0)
    hint_whitened_weight: float = option(
        0.0, help="in the hints stage, weight of the squared error between the student's and the teacher's normalised "
        "image embeddings in the teacher's whitened space (fitted on the train images' embeddings): every direction "
        "the images vary along counts alike, so the quiet ones, where relations lie, are not left for late passes "
        "(docs/lab_book.md, \"The student's quiet directions\"; 0: off)", at_least=0)
    hint_whiten_ridge: float = option(
        0.1, help="the whitening's ridge: added to each eigenvalue of the teacher's embedding covariance, as a share "
        "of their mean, before the -1/2 power (smaller: the quietest directions weigh more)", above=0)
    hint_flips: list[str] = option(
        factory=list, help="the hints stage also trains on each train image mirrored on these axes (horizontal, "
        "vertical; every combination), the teacher's maps and embeddings computed for each view: an epoch then "
        "passes over every view (image-side targets need no caption, so the flips are free of text rewriting)")
    hint_projection: bool = option(
        False, help="after the hints, the image tower's output projection starts as the least-squares readout of "
        "the teacher's image embeddings from the student's class token, instead of at random (needs hint_epochs)")


# the options that only shape the hints stage, and what each is to it (each needs hint_epochs)
HINT_OPTIONS = {"hint_embedding_weight": "is a term of the hints stage",
                "hint_whitened_weight": "is a term of the hints stage",
                "hint_flips": "are views of the hints stage",
                "hint_projection": "reads the hint-trained tower"}


def hint_terms(cfg: DistillConfig) -> EmbeddingTerms:
    """The hints stage's terms on the image embedding, from the config."""
    return EmbeddingTerms(cfg.hint_embedding_weight, cfg.hint_whitened_weight, cfg.hint_whiten_ridge)


def similarity_regulator(teacher_sim: torch.Tensor, student_sim: torch.Tensor) -> torch.Tensor:
    """Eq. (2) over a B×B similarity matrix (matched pairs on the diagonal), divided by B."""
    eye = torch.eye(len(teacher_sim), dtype=torch.bool, device=teacher_sim.device)
    matched = F.relu(teacher_sim - student_sim)[eye].sum()
    unmatched = F.relu(student_sim - teacher_sim)[~eye].sum()
    return (matched + unmatched) / len(teacher_sim)


def student_config(teacher, cfg: DistillConfig) -> LClipConfig:
    """The student's shape: the teacher's sizes where it is a ViT; for another image tower (a ResNet)
    the student's image tower is a conv stem and multiplexed blocks of `vision_width`."""
    visual = teacher.visual
    size = image_side(visual)
    text_width = teacher.ln_final.weight.shape[0]
    embed_dim = teacher.text_projection.shape[1]
    if _is_vit(visual):
        width, patch = visual.conv1.weight.shape[0], visual.conv1.weight.shape[-1]
        image_dim = visual.proj.shape[1] if visual.proj is not None else width
        if cfg.stem_channels and stem_stride(cfg.stem_channels) != patch:
            raise ConfigError(f"stem_channels {cfg.stem_channels}: {len(cfg.stem_channels) + 1} stride-2 convs must "
                              f"match the teacher's patch size {patch}")
    elif not cfg.stem_channels:
        raise ConfigError("the teacher's image tower is not a ViT: give the student a conv stem (stem_channels)")
    else:
        width, patch, image_dim = cfg.vision_width or text_width, stem_stride(cfg.stem_channels), embed_dim
    if image_dim != embed_dim:
        raise ConfigError(f"teacher image and text embeddings differ in size ({image_dim} vs {embed_dim}); "
                          "the student distils both into one space and needs them equal")
    heads = cfg.text_heads or text_heads(teacher)
    if text_width % heads:
        raise ConfigError(f"text_heads {heads} does not divide the teacher's text width {text_width}")
    if cfg.embed_dim and cfg.embed_dim != embed_dim:
        raise ConfigError(f"student embed_dim {cfg.embed_dim} differs from the teacher's {embed_dim}: L_D compares "
                          "teacher and student embeddings directly, so they must have one size (set embed_dim: 0)")
    return LClipConfig(embed_dim=embed_dim, image_size=size, patch_size=patch, vision_width=width,
                       vision_layers=cfg.vision_layers, vision_heads=default_heads(width),
                       context_length=int(teacher.context_length), vocab_size=teacher.token_embedding.weight.shape[0],
                       embed_rank=cfg.embed_rank, text_width=text_width, text_layers=cfg.text_layers,
                       text_heads=heads, repeats=cfg.repeats,
                       stem_channels=tuple(cfg.stem_channels), stem_norm=cfg.stem_norm)


def _is_vit(visual) -> bool:
    return hasattr(visual, "conv1") and hasattr(visual, "transformer") and hasattr(visual, "class_embedding")


def token_counts(tokenizer: ClipTokenizer, train: Split, vocab: int) -> torch.Tensor:
    """[vocab] how often each token occurs in the train split's captions (short and long)."""
    texts = [text for pool in train.pool("both") for text in pool]
    ids = [token for row in tokenizer.ids(texts) for token in row]
    return torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab).float()


@torch.no_grad()
def init_from_teacher(student: LClip, teacher, counts: torch.Tensor | None = None) -> None:
    """Copy what fits: the text tower (positions, norms, projection, spread-out blocks, a rank-r
    factorisation of the token embedding) and, from a ViT teacher with the same stem, the image tower too.

    The factorisation is the truncated SVD of the teacher's table; with `counts` (`token_counts`), its r directions
    are those of the rows the training texts use, weighted by the square root of their counts, and every
    row keeps its projection onto them. A vocabulary of 49,408 rows of which a domain uses a hundred
    otherwise spends its rank on rows no text holds (on the world: 80% error on the used rows at rank 32,
    27% weighted by use)."""
    s_img, s_txt, t_vis = student.image_encoder, student.text_encoder, teacher.visual
    if _is_vit(t_vis) and not student.config.stem_channels:
        for name in ("conv1", "ln_pre", "ln_post"):
            getattr(s_img, name).load_state_dict(getattr(t_vis, name).state_dict())
        s_img.class_embedding.copy_(t_vis.class_embedding)
        s_img.positional_embedding.copy_(t_vis.positional_embedding)
        s_img.proj.copy_(t_vis.proj)
        _copy_blocks(s_img.blocks, t_vis.transformer.resblocks)
    s_txt.positional_embedding.copy_(teacher.positional_embedding)
    s_txt.ln_final.load_state_dict(teacher.ln_final.state_dict())
    s_txt.text_projection.copy_(teacher.text_projection)
    table = teacher.token_embedding.weight.float()
    rank = s_txt.token_embedding.weight.shape[1]
    if counts is None:
        u, s, v = torch.linalg.svd(table, full_matrices=False)
        s_txt.token_embedding.weight.copy_(u[:, :rank] * s[:rank])
        s_txt.token_projection.weight.copy_(v[:rank].t())
    else:
        directions = torch.linalg.svd(counts.to(table.device).sqrt()[:, None] * table,
                                      full_matrices=False)[2][:rank]  # [rank, width]
        s_txt.token_embedding.weight.copy_(table @ directions.t())
        s_txt.token_projection.weight.copy_(directions.t())
    _copy_blocks(s_txt.blocks, teacher.transformer.resblocks)
    student.logit_scale.copy_(teacher.logit_scale)


def _copy_blocks(student_blocks, teacher_blocks) -> None:
    runs = len(student_blocks) * len(student_blocks[0].norm1.instances)
    picks = [round(k * (len(teacher_blocks) - 1) / max(1, runs - 1)) for k in range(runs)]
    for b, block in enumerate(student_blocks):
        repeats = len(block.norm1.instances)
        shared = teacher_blocks[picks[b * repeats]]
        block.attn.qkv.weight.copy_(shared.attn.in_proj_weight)
        block.attn.qkv.bias.copy_(shared.attn.in_proj_bias)
        block.attn.proj.load_state_dict(shared.attn.out_proj.state_dict())
        block.fc1.load_state_dict(shared.mlp.c_fc.state_dict())
        block.fc2.load_state_dict(shared.mlp.c_proj.state_dict())
        for r in range(repeats):
            source = teacher_blocks[picks[b * repeats + r]]
            block.norm1.instances[r].load_state_dict(source.ln_1.state_dict())
            block.norm2.instances[r].load_state_dict(source.ln_2.state_dict())


def distill_lclip(cfg: DistillConfig, progress: bool = True) -> dict:
    _validate(cfg)
    if (done := finished_summary(cfg, cfg.out, progress)) is not None:
        return done
    summary_path = Path(cfg.out).with_suffix(".json")
    run = RecipeRun(cfg, cfg.out, Path(cfg.out).with_suffix(".log.jsonl"), progress)
    loaded = load_open_clip(cfg.teacher_arch, cfg.teacher)
    teacher = loaded.model.to(run.device).eval().requires_grad_(False)
    student = LClip(student_config(teacher, cfg))
    tokenizer = ClipTokenizer(int(teacher.context_length))
    train = load_split(cfg.dataset, cfg.images_root, "train", cfg.max_train_images,
                       allow_outside_root=cfg.allow_outside_root)
    counts = token_counts(tokenizer, train, student.config.vocab_size) if cfg.embed_init == "used" else None
    init_from_teacher(student, teacher, counts)
    # the temperature stays the teacher's: no loss here reads the student's, and DDP waits for every
    # parameter that asks for a gradient
    student.logit_scale.requires_grad_(False)
    val = load_split(cfg.dataset, cfg.images_root, "val", cfg.max_val_images,
                     allow_outside_root=cfg.allow_outside_root)
    for split in (train, val):
        cache_pixels(split, loaded.preprocess, cfg.image_cache_mb, cfg.workers)
    scenes = load_scenes(cfg.scenes) if cfg.negatives == "world" or cfg.vision_pretrain_epochs else {}
    dataset = TextsDataset(train, loaded.preprocess, distill_texts(train, cfg, scenes), cfg.seed)
    teacher_pair = PairEncoder.of_clip(teacher)
    pair = PairEncoder(student, student.encode_text)

    def evaluate(epoch: int) -> dict:
        return compare_on_val(teacher, student, tokenizer, val, loaded.preprocess, run.device, cfg.workers)

    if cfg.vision_pretrain_epochs:
        pretrain_on_scene_labels(run, student.image_encoder, student.config.embed_dim, train, loaded.preprocess,
                                 scenes, cfg.vision_pretrain_epochs)
    if cfg.hint_epochs:
        pretrain_on_hints(run, student.image_encoder, teacher.visual, train, loaded.preprocess, cfg.hint_epochs,
                          cfg.workers, cfg.hint_projection, hint_terms(cfg), cfg.hint_flips)
    record: dict = {}
    steps = max(1, len(train) // cfg.batch_size) * cfg.stage1_epochs
    stages = (Stage("stage1", cfg.stage1_epochs, cfg.lr, min(50, steps // 10 + 1)),
              # stage 2 keeps its small rate constant, as the paper does
              Stage("stage2", cfg.stage2_epochs, cfg.stage2_lr, 0, "constant"))
    for stage in stages:
        if not stage.epochs:
            continue
        # with no gradient, the frozen tower's texts run without autograd and are left out of the optimizer
        student.text_encoder.requires_grad_(not (stage.name == "stage2" and cfg.stage2_freeze_text))

        def step(model: torch.nn.Module, batch: dict, stage: Stage = stage) -> tuple[torch.Tensor, dict[str, float]]:
            return distill_step(model, teacher_pair, batch, cfg.sr_weight if stage.name == "stage2" else 0.0,
                                cfg.rank_weight)

        record = run.fit(pair, dataset, TextBatcher(tokenizer), step, stage, evaluate=evaluate)["record"] or record
    summary = {"out": cfg.out, "teacher_params": _params(teacher), "student_params": _params(student), **record}
    if run.is_main:
        save_student(student, cfg.out, stage_epochs=(cfg.stage1_epochs, cfg.stage2_epochs))
        if cfg.scenes:
            report = foil_accuracy(student.encode_image, student.encode_text, tokenizer, val, loaded.preprocess,
                                   cfg.scenes, "clip_s", run.device, cfg.workers)
            summary.update(announce(f"{cfg.out} (l_clip_s)", report))
        write_json(summary_path, summary_record(cfg, summary), indent=2)
    run.finish()
    return summary


def distill_texts(train: Split, cfg: DistillConfig, scenes: dict[int, Scene]):
    """texts(row, rng): one caption of the image, and hard negatives of it (the student learns how the
    teacher tells them apart)."""
    pools = train.pool("both")

    def texts(row: int, rng: random.Random) -> list[str]:
        caption = pick(pools[row], rng)
        if cfg.negatives != "world" or not cfg.hard_negatives:
            return [caption]
        negatives = hard_negatives(caption, scenes[train.image_ids[row]], rng, cfg.hard_negatives, KINDS)
        return [caption, *(n.text for n in negatives)]

    return texts


def distill_step(pair: torch.nn.Module, teacher: PairEncoder, batch: dict,
                 sr_weight: float, rank_weight: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """L_D on the images and on every text; with sr_weight, the similarity regulator on image x caption;
    with rank_weight, the ranking of each image's own texts (`rank_distill_loss`)."""
    tokens, mask = batch["tokens"], batch["mask"]
    b, t, length = tokens.shape
    flat = tokens.view(b * t, length)
    with torch.no_grad():
        t_img, t_txt, t_scale, _ = teacher(batch["images"], flat, prefix_tree(flat, t))
    s_img, s_txt, _, _ = pair(batch["images"], flat)
    t_img, s_img = gather_with_grad(t_img.float()), gather_with_grad(s_img.float())
    t_txt, s_txt = gather_with_grad(t_txt.float().view(b, t, -1)), gather_with_grad(s_txt.float().view(b, t, -1))
    valid = gather_with_grad(mask)
    image_loss, text_loss = distill_loss(t_img, s_img), distill_loss(t_txt[valid], s_txt[valid])
    loss = image_loss + text_loss
    parts = {"image_ld": image_loss.item(), "text_ld": text_loss.item()}
    if sr_weight:
        t_sim = F.normalize(t_img, dim=-1) @ F.normalize(t_txt[:, 0], dim=-1).t()
        s_sim = F.normalize(s_img, dim=-1) @ F.normalize(s_txt[:, 0], dim=-1).t()
        regulator = similarity_regulator(t_sim, s_sim)
        loss = loss + sr_weight * regulator
        parts["sr"] = regulator.item()
    if rank_weight and t > 1:
        ranking = rank_distill_loss(t_img, t_txt, s_img, s_txt, valid, t_scale.exp())
        loss = loss + rank_weight * ranking
        parts["rank"] = ranking.item()
    return loss, parts


def rank_distill_loss(t_img: torch.Tensor, t_txt: torch.Tensor, s_img: torch.Tensor, s_txt: torch.Tensor,
                      valid: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of each image's softmax over its own texts [B, T] (its caption and hard
    negatives; `valid` marks real ones), both at the teacher's logit scale."""
    def logits(image: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
        cosine = torch.einsum("bd,btd->bt", F.normalize(image, dim=-1), F.normalize(texts, dim=-1))
        return (scale * cosine).masked_fill(~valid, float("-inf"))

    teacher_log = F.log_softmax(logits(t_img, t_txt), dim=1)
    student_log = F.log_softmax(logits(s_img, s_txt), dim=1)
    kl = (teacher_log.exp() * (teacher_log - student_log)).masked_fill(~valid, 0.0).sum(dim=1)
    return kl.mean()


@torch.no_grad()
def compare_on_val(teacher, student: LClip, tokenizer: ClipTokenizer, val: Split, transform,
                   device: torch.device, workers: int = 0, seed: int = 0) -> dict:
    """Val R@1 of both models, and how often each one's CLIP-S prefers an image's own caption to
    another image's (l_clip_s for the student, clip_s for the teacher)."""
    student.eval()
    captions = [pool[0] for pool in val.short]
    rng = random.Random(seed)
    shift = rng.randrange(1, len(captions)) if len(captions) > 1 else 0
    mismatched = captions[shift:] + captions[:shift]
    out = {}
    for name, encode_image, encode_text in (("teacher", teacher.encode_image, clip_text_forward(teacher)),
                                            ("student", student.encode_image, student.encode_text)):
        image = embed_split_images(encode_image, val, transform, device, workers)

        def text(texts: list[str], encode=encode_text) -> torch.Tensor:
            return embed_texts(encode, tokenizer, texts, device)

        recall = recall_at_1(image, text(captions))
        right = clip_s(image, text([CLIP_S_PREFIX + c for c in captions]))
        wrong = clip_s(image, text([CLIP_S_PREFIX + c for c in mismatched]))
        out.update({f"{name}_i2t_r1": recall["i2t_r1"], f"{name}_t2i_r1": recall["t2i_r1"],
                    f"{name}_match_acc": float((right > wrong).float().mean())})
    out["chance_r1"] = 1.0 / len(captions)
    student.train()
    return out


def save_student(student: LClip, out: str, stage_epochs: tuple[int, int]) -> None:
    state = {f"student.{k}": v.detach().cpu().contiguous() for k, v in student.state_dict().items()}
    with atomic_path(out) as tmp:
        # head counts go where a Lightning checkpoint keeps its settings: the weights do not fix them
        torch.save({"state_dict": state, "epoch": sum(stage_epochs), "stage_epochs": list(stage_epochs),
                    "hyper_parameters": heads_entry(student.config)}, tmp)


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _validate(cfg: DistillConfig) -> None:
    require_keys(cfg, ("teacher", "dataset", "images_root", "out"), "distill_lclip")
    for key in ("vision_layers", "text_layers"):
        if getattr(cfg, key) % cfg.repeats:
            raise ConfigError(f"{key} ({getattr(cfg, key)}) must be a multiple of repeats ({cfg.repeats})")
    if cfg.negatives == "world" and not cfg.scenes:
        raise ConfigError("negatives: world needs 'scenes' (the world's scenes.json)")
    if unknown := sorted(set(cfg.hint_flips) - set(AXES)):
        raise ConfigError(f"hint_flips: unknown {unknown}; known: {', '.join(AXES)}")
    for key, role in HINT_OPTIONS.items():
        if getattr(cfg, key) and not cfg.hint_epochs:
            raise ConfigError(f"{key} {role}: it needs hint_epochs")
    if cfg.vision_pretrain_epochs and not cfg.scenes:
        raise ConfigError("vision_pretrain_epochs needs 'scenes' (the world's scenes.json: the labels)")
