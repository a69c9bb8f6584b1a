"""SPICE through pycocoevalcap, only where its Stanford CoreNLP models are installed.

pycocoevalcap fetches Stanford CoreNLP 3.6.0 on first use; with no network that cannot work, so
the suite checks for the jars first and reports SPICE as skipped, with the reason, when absent.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")


def spice_lib_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("pycocoevalcap.spice")
    return os.path.join(os.path.dirname(spec.origin), "lib") if spec and spec.origin else ""


def spice_unavailable_reason() -> str | None:
    if shutil.which("java") is None:
        return "SPICE needs Java (no `java` on PATH)"
    lib = spice_lib_dir()
    missing = [jar for jar in CORENLP_JARS if not os.path.exists(os.path.join(lib, jar))]
    if missing:
        return (f"SPICE needs Stanford CoreNLP 3.6.0 ({', '.join(missing)}) in {lib}; they are downloaded on "
                "first use and no network is available here - copy them there to enable SPICE")
    return None


def spice_scores(ids: Sequence[int], candidates: Sequence[str],
                 references: Sequence[Sequence[str]]) -> tuple[float, list[float]]:
    """Per-row SPICE F-scores, in the rows' order. Rows are keyed by their index, not their image
    id: pycocoevalcap returns scores in sorted-key order, and rows that share an image (foils,
    candidate pairs) must not collapse into one."""
    from pycocoevalcap.spice.spice import Spice

    rows = list(range(len(ids)))
    gts = {row: list(refs) for row, refs in zip(rows, references, strict=True)}
    res = {row: [cand] for row, cand in zip(rows, candidates, strict=True)}
    corpus, items = Spice().compute_score(gts, res)
    by_row = dict(zip(sorted(gts), (float(item["All"]["f"]) for item in items), strict=True))
    return float(corpus), [by_row[row] for row in rows]
