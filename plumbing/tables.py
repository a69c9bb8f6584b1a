"""The one table formatter: aligned plain text for terminals, or markdown for reports."""

from __future__ import annotations

from collections.abc import Sequence


def format_value(value: object, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return "" if value is None else str(value)


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]], markdown: bool = False) -> str:
    """Rows of cells (floats shown with 4 decimals) under a header."""
    cells = [[format_value(c) for c in row] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in cells]
        return "\n".join(lines)
    widths = [max([len(h), *(len(row[k]) for row in cells)]) for k, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)
