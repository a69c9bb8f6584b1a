"""The text edits' editor as a training recipe uses it (`negatives: text` in train_clip and train_specs):
parsed once over the captions the run draws from, with the captions no edit applies to counted and named
before training starts, so an option that would train nothing is an error, not a quiet no-op."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable, Sequence

from plumbing.errors import ConfigError, DataError
from rewards.text.edits import KINDS, EditStats, TextEditor


def check_text_edits(kinds: Sequence[str]) -> None:
    """A recipe's `text_edits`, checked before any model loads."""
    if unknown := sorted(set(kinds) - set(KINDS)):
        raise ConfigError(f"text_edits: unknown {unknown}; known: {', '.join(KINDS)}")


def checked_text_editor(captions: Iterable[str], kinds: Sequence[str], seed: int, source: str) -> TextEditor:
    """A `TextEditor` over `captions`; raises DataError naming `source` when no caption admits an edit,
    warns (with examples) when some do not. Its stats start empty: the run's own counts, not the probe's."""
    unique = list(dict.fromkeys(captions))
    editor = TextEditor(unique, kinds)
    probe = random.Random(seed)
    bare = [c for c in unique if not editor.edits(c, probe, 1)]
    if unique and len(bare) == len(unique):
        raise DataError(f"{source}: negatives: text: no edit of {', '.join(kinds)} applies to any train caption "
                        f"(e.g. {bare[0]!r}); allow more edits or use negatives: none")
    if bare:
        print(f"warning: negatives: text: {len(bare)} of {len(unique)} train captions admit no edit and "
              f"train without hard negatives, e.g. {bare[:3]}", file=sys.stderr)
    editor.stats = EditStats()
    return editor


def edit_summary(editor: TextEditor, out: str, announce: bool) -> dict:
    """What a finished model's summary records about its text negatives (printed by the main process)."""
    if announce:
        print(f"{out}: text negatives: {editor.stats.summary()}", flush=True)
    return {"tried": dict(editor.stats.tried), "impossible": dict(editor.stats.impossible),
            "captions_without_edit": len(editor.stats.no_edit)}
