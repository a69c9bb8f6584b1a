"""PNG figures for reports and sweeps: one small panel per series, written atomically."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from plumbing.atomic import atomic_path


def plot_panels(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], xlabel: str, path: str | Path,
                title: str = "", columns: int = 4, baselines: Mapping[str, float] | None = None,
                errors: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None) -> Path:
    """One panel per named (x, y) series, sharing the x label, with an optional dashed reference
    level per series (`baselines`) and an optional interval (low, high) around each point (`errors`;
    NaN ends draw none); returns the written path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    names = list(series)
    if not names:
        raise ValueError("nothing to plot")
    columns = min(columns, len(names))
    rows = math.ceil(len(names) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        xs, ys = series[name]
        ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=3)
        if errors and name in errors:
            lows, highs = errors[name]
            below = [y - low if low == low else 0.0 for y, low in zip(ys, lows, strict=True)]  # NaN: none
            above = [high - y if high == high else 0.0 for y, high in zip(ys, highs, strict=True)]
            ax.errorbar(xs, ys, yerr=[below, above], fmt="none", capsize=3, linewidth=1)
        if baselines and name in baselines:
            ax.axhline(baselines[name], linestyle="--", color="gray", linewidth=1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save_png(fig, list(axes.flat)[len(names):], path)


def contact_sheet(images: Sequence[str | Path], captions: Sequence[Sequence[str]], path: str | Path,
                  columns: int = 4, labels: Sequence[str] = ()) -> Path:
    """A PNG grid: each image with its captions under it (one line each, prefixed by `labels`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    if not images:
        raise ValueError("no images for the contact sheet")
    columns = min(columns, len(images))
    rows = math.ceil(len(images) / columns)
    titles = ["\n".join(textwrap.fill(f"{labels[k]}: {t}" if k < len(labels) else t, 38) for k, t in enumerate(texts))
              for texts in captions]
    lines = max(title.count("\n") + 1 for title in titles)  # the tallest title sets the row height
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, (3.2 + 0.14 * lines) * rows), squeeze=False)
    for ax, image, title in zip(axes.flat, images, titles, strict=False):
        with Image.open(image) as img:
            ax.imshow(img.convert("RGB"))
        ax.set_title(title, fontsize=7, loc="left")
        ax.axis("off")
    return _save_png(fig, list(axes.flat)[len(images):], path)


def _save_png(fig, unused_axes: Sequence, path: str | Path) -> Path:
    """The figure with its unused panels blanked, laid out and written to `path` atomically; closed."""
    import matplotlib.pyplot as plt

    for ax in unused_axes:
        ax.axis("off")
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path
