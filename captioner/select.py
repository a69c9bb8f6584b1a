"""`python -m captioner.select --run DIR --by <metric>`: the best epoch of a run by any metric
in its metrics.jsonl, with the per-epoch table."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from captioner.cli import command
from captioner.errors import DataError
from captioner.run_log import read_metrics

LOWER_IS_BETTER = {"val_loss", "train_loss", "repeat_2", "bad_ending", "hallucination_mention",
                   "hallucination_caption", "attribute_error"}


def best_epoch(records: list[dict], by: str, mode: str | None = None) -> dict:
    usable = [r for r in records if isinstance(r.get(by), (int, float))]
    if not usable:
        known = sorted({k for r in records for k, v in r.items() if isinstance(v, (int, float))})
        raise DataError(f"no epoch has metric {by!r}; metrics in this run: {', '.join(known)}")
    mode = mode or ("min" if by in LOWER_IS_BETTER else "max")
    return (min if mode == "min" else max)(usable, key=lambda r: r[by])


def format_epochs(records: list[dict], columns: list[str], marked: int | None) -> str:
    header = ["epoch", *columns]
    rows = [[str(r["epoch"]) + (" *" if r["epoch"] == marked else "")]
            + [f"{r[c]:.4f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in columns] for r in records]
    widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m captioner.select", description=__doc__)
    parser.add_argument("--run", required=True, help="a run directory (holds metrics.jsonl)")
    parser.add_argument("--by", default="cider", help="metric to select by (default cider)")
    parser.add_argument("--mode", choices=("max", "min"), help="default: min for losses and error rates, else max")
    args = parser.parse_args(argv)
    records = read_metrics(Path(args.run))
    if not records:
        raise DataError(f"{args.run}: no metrics.jsonl (or it is empty)")
    best = best_epoch(records, args.by, args.mode)
    columns = [k for k, v in records[-1].items() if isinstance(v, float) and k != "seconds"]
    print(format_epochs(records, columns, best["epoch"]))
    ckpt = Path(args.run) / "checkpoints" / f"epoch_{best['epoch']}"
    print(f"best by {args.by}: epoch {best['epoch']} ({best[args.by]:.4f})"
          + (f"; checkpoint {ckpt}" if ckpt.exists() else "; its checkpoint was pruned"))
    print(json.dumps({"run": args.run, "by": args.by, "epoch": best["epoch"], "value": best[args.by],
                      "checkpoint": str(ckpt) if ckpt.exists() else None}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
