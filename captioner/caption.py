"""`python -m captioner.caption --checkpoint CKPT --images DIR_OR_FILES --out results.json`

Captions raw images with a trained checkpoint: no dataset.json, no references. Features come from
the backbone recorded in the checkpoint, computed here exactly as `features.extract` computed them
for training (pixel patches, or open_clip with the same weights: `--pretrained`; a different
fingerprint is an error). Files that are not readable images are listed and skipped. Writes COCO
results JSON (`image_id` from the number in the file name, and `file_name`), or, with
`--coco-test-naming`, `captions_test2014_<alg>_results.json` in the --out folder; `--report DIR`
adds a markdown page and a PNG contact sheet of the images with their captions.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.checkpoint import TrainerState, read_checkpoint
from captioner.decoding import Constraints, DecodeConfig, decode
from captioner.inference import load_captioner
from captioner.plots import contact_sheet
from features.backbones import make_backbone
from features.images import ImageFiles, file_image_ids, image_files
from plumbing.atomic import write_json, write_text
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option, require_keys
from plumbing.device import pick_device
from plumbing.errors import ConfigError, DataError


@dataclass
class CaptionConfig:
    checkpoint: str = option("", help="a checkpoint directory, e.g. runs/x/checkpoints/best")
    images: list[str] = option(factory=list, help="image files or folders (comma list; folders are not recursive)")
    out: str = option("", help="results JSON (COCO results format); a folder with --coco-test-naming")
    pretrained: str | None = option(None, help="the open_clip weights the checkpoint's features came from (its "
                                    "fingerprint is checked)")
    decode: DecodeConfig = option(factory=DecodeConfig, help="decoding options", flatten=True)
    batch_size: int = option(50, help="images per batch", at_least=1)
    workers: int = option(2, help="image-decoding DataLoader workers", at_least=0)
    device: str = option("auto", help="auto (the GPU when present), cpu or cuda")
    coco_test_naming: bool = option(False, help="write --out/captions_test2014_<alg>_results.json (COCO test server)")
    alg: str = option("rlcap", help="the algorithm name in COCO test-server file names")
    report: str | None = option(None, help="also write DIR/captions.md and DIR/captions.png (a contact sheet)")


def feature_backbone(state: TrainerState, pretrained: str | None, device: torch.device):
    """The feature extractor the checkpoint was trained on, rebuilt and checked by fingerprint."""
    name = state.feats_backbone
    if name == "patches":
        patch = round(math.sqrt(state.feat_dim / 3))
        backbone = make_backbone("patches", image_size=round(math.sqrt(state.n_tokens)) * patch, patch=patch)
    elif name.startswith("open_clip:"):
        if not pretrained:
            raise ConfigError(f"the checkpoint's features come from {name}; give its weights with --pretrained")
        backbone = make_backbone(name, pretrained, device=device)
    else:
        raise DataError(f"the checkpoint's features come from {name!r}, which rlcap cannot compute from images "
                        "(imported features); caption images with a checkpoint trained on patches or open_clip")
    if state.feats_fingerprint and backbone.fingerprint != state.feats_fingerprint:
        raise DataError(f"{name} {pretrained or ''}: fingerprint {backbone.fingerprint} differs from the one the "
                        f"checkpoint was trained on ({state.feats_fingerprint}); use the same weights")
    return backbone


def caption_files(cfg: CaptionConfig, progress: bool = True) -> tuple[dict[Path, list[str]], dict[Path, str]]:
    """Captions per readable file, and the reason each skipped file was skipped."""
    model, _, vocab = load_captioner(cfg.checkpoint)
    state = read_checkpoint(Path(cfg.checkpoint))[0]
    device = pick_device(cfg.device)
    backbone = feature_backbone(state, cfg.pretrained, device)
    files = image_files(cfg.images)
    dtype = getattr(torch, state.feats_dtype) if state.feats_dtype else torch.float32
    model.to(device)
    constraints = Constraints.of(cfg.decode, vocab)
    rows = list(range(len(files)))
    loader = DataLoader(ImageFiles([str(f) for f in files], None, rows, backbone.transform),
                        batch_size=cfg.batch_size, num_workers=cfg.workers, collate_fn=_keep_errors)
    captions, skipped = {}, {}
    for rows, images, errors in tqdm(loader, desc="caption", unit="batch", disable=not progress):
        skipped.update({files[row]: why for row, why in errors})
        if not rows:
            continue
        encoded = backbone.encode(images)
        att, fc = encoded.att.to(dtype).float().to(device), encoded.fc.to(dtype).float().to(device)
        mask = torch.ones(att.shape[:2], dtype=torch.bool, device=device)
        texts = vocab.decode_batch(decode(model, att, fc, mask, cfg.decode, constraints).tokens)
        per_image = len(texts) // len(rows)
        for k, row in enumerate(rows):
            captions[files[row]] = texts[k * per_image: (k + 1) * per_image]
    return captions, skipped


def _keep_errors(items: list) -> tuple[list[int], torch.Tensor | None, list[tuple[int, str]]]:
    """Unreadable files come back as (row, reason) beside the batch of the readable ones."""
    good = [(row, image) for row, image, error in items if not error]
    errors = [(row, error) for row, _, error in items if error]
    images = torch.stack([image for _, image in good]) if good else None
    return [row for row, _ in good], images, errors


def results_path(cfg: CaptionConfig) -> Path:
    if cfg.coco_test_naming:
        return Path(cfg.out) / f"captions_test2014_{cfg.alg}_results.json"
    return Path(cfg.out)


def write_report(folder: Path, entries: list[dict], files: dict[int, Path]) -> None:
    shown = entries[:24]
    sheet = contact_sheet([files[e["image_id"]] for e in shown], [[e["caption"]] for e in shown],
                          folder / "captions.png")
    lines = ["# Captions\n", f"![contact sheet]({sheet.name})\n", "| image | caption |", "|---|---|"]
    lines += [f"| {e['file_name']} | {e['caption']} |" for e in entries]
    write_text(folder / "captions.md", "\n".join(lines) + "\n")


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(CaptionConfig, "python -m captioner.caption", __doc__)
    cfg, _ = parse_config(CaptionConfig, parser, argv)
    require_keys(cfg, ("checkpoint", "images", "out"), "caption")
    captions, skipped = caption_files(cfg)
    for why in skipped.values():
        print(f"skipped: {why}", file=sys.stderr)
    if not captions:
        raise DataError(f"none of the {len(skipped)} file(s) in {', '.join(cfg.images)} is a readable image")
    files = list(captions)
    image_ids, from_names = file_image_ids(files)
    ids = dict(zip(files, image_ids, strict=True))
    if not from_names:
        print("note: the file names do not each carry a number of their own: image ids are the files' positions "
              "(file_name in the results names each file)", file=sys.stderr)
    rows = [{"image_id": ids[f], "caption": text, "file_name": f.name} for f in files for text in captions[f]]
    out = results_path(cfg)
    # the COCO test server takes exactly image_id and caption
    write_json(out, [{"image_id": r["image_id"], "caption": r["caption"]} for r in rows] if cfg.coco_test_naming
               else rows)
    if cfg.report:
        write_report(Path(cfg.report), rows, {ids[f]: f for f in files})
    print(f"wrote {len(rows)} caption(s) of {len(files)} image(s) to {out}"
          + (f"; skipped {len(skipped)} unreadable file(s)" if skipped else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
