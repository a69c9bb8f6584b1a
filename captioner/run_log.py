"""What a run leaves for people: metrics.jsonl (appended and flushed per epoch), tensorboard
scalars and sample tables, and samples/epoch_<k>.json in COCO results format."""

from __future__ import annotations

from pathlib import Path

from plumbing.atomic import append_line, to_json, write_json
from plumbing.jsonl import read_jsonl


class RunLog:
    def __init__(self, run_dir: Path, enabled: bool):
        self.run_dir, self.enabled = run_dir, enabled
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            (run_dir / "samples").mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, markdown, step)

    def epoch(self, record: dict) -> None:
        if self.enabled:
            append_line(self.run_dir / "metrics.jsonl", to_json(record))
            self.writer.flush()

    def samples(self, epoch: int, captions: dict[int, str]) -> None:
        if self.enabled:
            results = [{"image_id": int(i), "caption": c} for i, c in sorted(captions.items())]
            write_json(self.run_dir / "samples" / f"epoch_{epoch}.json", results)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """The run's epoch records; [] before its first epoch."""
    return read_jsonl(run_dir / "metrics.jsonl")
