"""Foils of any Karpathy dataset's captions, made by text edits alone (rewards/text/edits.py): the
ARO-style check of whether a reward model reads what a caption says on COCO, where no scene graph exists.
Each image's first reference is the caption; its other references stay its references; each edit kind
that applies gives one foil (`invert_relation` and `swap_objects` are VG-Relation's kind of foil,
`swap_attributes` VG-Attribution's)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from plumbing.karpathy import ImageEntry
from rewards.text.edits import TextEditor


def text_foils(entries: Sequence[ImageEntry], editor: TextEditor, seed: int = 0) -> list[dict]:
    """Items in the foil task's format, for the images whose first caption admits an edit."""
    rng = random.Random(seed)
    items = []
    for entry in entries:
        caption, *references = entry.raw_captions
        foils = [{"caption": e.text, "kind": e.kind} for e in editor.edits(caption, rng, len(editor.kinds))]
        if foils:
            items.append({"image_id": entry.image_id, "caption": caption, "references": references, "foils": foils})
    return items
