"""Read the append-and-flush logs (metrics.jsonl, a reward model's log): one JSON object a line.

A run killed mid-append (a full disk) can leave its last line cut short. That line was never a
record: it is left out with a note. Any other line that is not a JSON object is an error that
names the file and the line, since a reader cannot tell which epoch it held.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from plumbing.errors import DataError


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines log, in order; [] when the file does not exist."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None
    lines = text.split("\n")
    torn = lines.pop() if lines else ""  # what follows the last newline: empty unless an append was cut short
    records = [_record(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if torn.strip():
        try:
            records.append(_record(path, len(lines) + 1, torn))
        except DataError:
            print(f"warning: {path}: line {len(lines) + 1} was cut short (an interrupted append); left out",
                  file=sys.stderr)
    return records


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON (rlcap never writes a non-finite number)")


def _record(path: Path, number: int, line: str) -> dict:
    try:
        record = json.loads(line, parse_constant=_no_constant)
    except ValueError as exc:
        raise DataError(f"{path}: line {number} is not valid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise DataError(f"{path}: line {number} must be a JSON object, got {type(record).__name__}")
    return record
