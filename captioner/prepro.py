"""`python -m captioner.prepro`: Karpathy-format dataset.json -> vocab, labels, refs, CIDEr df.

Outputs under --out:
  vocab.json        ix_to_word (1-based; 0 is pad/EOS), the UNK word and the settings used
  labels.h5         labels [M, L] int32 (0 = pad), label_start_ix/label_end_ix [N] (1-based,
                    inclusive, as the reference SCST codebase), label_length [M], image_ids [N],
                    split [N]
  refs.json         {image_id: [raw reference captions]}, for the metric suite
  cider_df.json.gz  document frequencies of the train split (one document per image)
  prepro_config.yaml
Captions are tokenised like the metrics see them (plumbing.ptb: pycocoevalcap's PTB rules).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import h5py
import numpy as np

from plumbing.atomic import write_json
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import dump_config, option, require_keys, to_dict
from plumbing.errors import DataError
from plumbing.hdf5 import write_h5
from plumbing.karpathy import ImageEntry, load_dataset
from plumbing.locks import hold_lock, release_lock
from plumbing.ptb import ptb_tokenize
from plumbing.staged import recover, staged_folder
from rewards import document_frequency, save_df

UNK = "UNK"
TOKENIZER = "ptb-python"


@dataclass
class PreproConfig:
    dataset: str = option("", help="Karpathy-format dataset.json (COCO, Flickr, the offline world)")
    out: str = option("", help="output directory")
    min_count: int = option(5, help="words seen fewer times in train become UNK", at_least=1)
    max_len: int = option(16, help="captions are cut to this many tokens", at_least=1)


def tokenize_captions(entries: list[ImageEntry]) -> list[list[list[str]]]:
    return [[ptb_tokenize(raw).split() for raw in entry.raw_captions] for entry in entries]


def build_vocab(dataset: str, entries: list[ImageEntry], tokens: list[list[list[str]]], min_count: int) -> list[str]:
    """Words seen at least min_count times in the train split, most frequent first; UNK last.
    A dataset without train images, or whose train words all fall under min_count, is an error: the
    model would learn to say UNK and CIDEr-D's document frequencies would be empty."""
    counts: Counter[str] = Counter(
        word for entry, caps in zip(entries, tokens, strict=True) if entry.split == "train"
        for cap in caps for word in cap
    )
    if not any(entry.split == "train" for entry in entries):
        raise DataError(f"{dataset}: no image has split 'train' (or 'restval'); the vocabulary and CIDEr-D's "
                        "document frequencies come from the train split")
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    if not words:
        top = ", ".join(f"{w!r} {c}" for w, c in counts.most_common(3)) or "none: the captions have no words"
        raise DataError(f"{dataset}: no train word is seen min_count={min_count} times (the most frequent: {top}); "
                        "lower --min-count")
    return [*words, UNK]


def encode_labels(tokens: list[list[list[str]]], vocab: list[str], max_len: int) -> dict[str, np.ndarray]:
    word_to_ix = {w: i + 1 for i, w in enumerate(vocab)}
    unk = word_to_ix[UNK]
    rows, lengths, starts, ends = [], [], [], []
    for caps in tokens:
        starts.append(len(rows) + 1)
        for cap in caps:
            ids = [word_to_ix.get(w, unk) for w in cap[:max_len]]
            rows.append(ids + [0] * (max_len - len(ids)))
            lengths.append(len(ids))
        ends.append(len(rows))
    return {
        "labels": np.asarray(rows, dtype=np.int32).reshape(-1, max_len),
        "label_length": np.asarray(lengths, dtype=np.int32),
        "label_start_ix": np.asarray(starts, dtype=np.int64),
        "label_end_ix": np.asarray(ends, dtype=np.int64),
    }


def write_labels(path: Path, arrays: dict[str, np.ndarray], entries: list[ImageEntry], vocab_size: int) -> None:
    def fill(h5: h5py.File) -> None:
        for name, array in arrays.items():
            h5.create_dataset(name, data=array)
        h5.create_dataset("image_ids", data=np.asarray([e.image_id for e in entries], dtype=np.int64))
        h5.create_dataset("split", data=np.asarray([e.split for e in entries], dtype="S5"))
        h5.attrs["max_len"] = arrays["labels"].shape[1]
        h5.attrs["vocab_size"] = vocab_size
        h5.attrs["label_ix_base"] = 1

    write_h5(path, fill)


OUTPUTS = ("labels.h5", "vocab.json", "refs.json", "cider_df.json.gz", "prepro_config.yaml")
MANIFEST = "prepro_manifest.json"  # written last: the outputs are one set only when it matches them


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def is_complete(cfg: PreproConfig) -> bool:
    """The manifest says these outputs were made together, with this config, from this dataset."""
    out = Path(cfg.out)
    try:
        manifest = json.loads((out / MANIFEST).read_text())
        return (manifest["config"] == to_dict(cfg) and manifest["dataset"] == _stamp(Path(cfg.dataset))
                and all(manifest["files"][name] == _stamp(out / name) for name in OUTPUTS))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def prepro(cfg: PreproConfig) -> Path:
    require_keys(cfg, ("dataset", "out"), "prepro")
    entries = load_dataset(cfg.dataset)
    entries, tokens = drop_empty_captions(cfg.dataset, entries, tokenize_captions(entries))
    vocab = build_vocab(cfg.dataset, entries, tokens, cfg.min_count)
    out = Path(cfg.out)
    hold_lock(out.with_name(out.name + ".lock"), f"prepro output {out}")
    # The new set is built beside a finished one and swapped in whole: a failed --force keeps the old.
    with staged_folder(out) as stage:
        write_labels(stage / "labels.h5", encode_labels(tokens, vocab, cfg.max_len), entries, len(vocab))
        write_json(stage / "vocab.json", {
            "ix_to_word": {str(i + 1): w for i, w in enumerate(vocab)}, "unk": UNK, "pad_ix": 0,
            "min_count": cfg.min_count, "max_len": cfg.max_len, "tokenizer": TOKENIZER,
        })
        write_json(stage / "refs.json", {str(e.image_id): e.raw_captions for e in entries})
        train_docs = (caps for e, caps in zip(entries, tokens, strict=True) if e.split == "train")
        df, n_docs = document_frequency(train_docs)
        save_df(stage / "cider_df.json.gz", df, n_docs, TOKENIZER)
        dump_config(cfg, stage / "prepro_config.yaml")
        write_json(stage / MANIFEST, {"config": to_dict(cfg), "dataset": _stamp(Path(cfg.dataset)),
                                      "files": {name: _stamp(stage / name) for name in OUTPUTS}}, indent=1)
    release_lock(out.with_name(out.name + ".lock"))
    return out


def drop_empty_captions(dataset: str, entries: list[ImageEntry],
                        tokens: list[list[list[str]]]) -> tuple[list[ImageEntry], list[list[list[str]]]]:
    """Captions with no words after tokenisation (punctuation only) would teach an image to say nothing:
    they leave the labels and the references, counted and named; an image left with none leaves the
    set, and a split left with no image is an error."""
    kept_entries, kept_tokens, emptied, dropped = [], [], [], []
    for entry, caps in zip(entries, tokens, strict=True):
        keep = [k for k, cap in enumerate(caps) if cap]
        if len(keep) < len(caps):
            emptied.append((entry.image_id, len(caps) - len(keep)))
        if not keep:
            dropped.append(entry)
            continue
        kept_entries.append(replace(entry, raw_captions=[entry.raw_captions[k] for k in keep]))
        kept_tokens.append([caps[k] for k in keep])
    if emptied:
        count = sum(n for _, n in emptied)
        ids = ", ".join(str(i) for i, _ in emptied[:5]) + (", ..." if len(emptied) > 5 else "")
        print(f"warning: {dataset}: dropped {count} caption(s) with no words after tokenisation (punctuation "
              f"only?) from {len(emptied)} image(s), ids {ids}", file=sys.stderr)
    if dropped:
        print(f"warning: {dataset}: {len(dropped)} image(s) have no caption left and are left out of the labels "
              f"and references, ids {', '.join(str(e.image_id) for e in dropped[:5])}"
              + (", ..." if len(dropped) > 5 else ""), file=sys.stderr)
        _check_splits_kept(dataset, entries, kept_entries, dropped)
    return kept_entries, kept_tokens


def _check_splits_kept(dataset: str, before: list[ImageEntry], after: list[ImageEntry],
                       dropped: list[ImageEntry]) -> None:
    emptied = sorted({e.split for e in before} - {e.split for e in after})
    if emptied:
        ids = [e.image_id for e in dropped if e.split == emptied[0]][:5]
        raise DataError(f"{dataset}: every image of split {emptied[0]!r} has only captions with no words after "
                        f"tokenisation (e.g. image ids {ids}); nothing of that split is left to train or score on")


def build_parser() -> argparse.ArgumentParser:
    parser = config_parser(PreproConfig, "python -m captioner.prepro", __doc__)
    parser.add_argument("--force", action="store_true", help="redo even if --out is up to date")
    return parser


@command
def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_config(PreproConfig, build_parser(), argv)
    if cfg.out:
        recover(Path(cfg.out))
    if not args.force and is_complete(cfg):
        print(f"{cfg.out} is up to date with {cfg.dataset}; nothing to do (--force to redo)")
        return 0
    out = prepro(cfg)
    print(f"wrote vocab.json, labels.h5, refs.json and cider_df.json.gz to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
