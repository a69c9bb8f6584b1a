"""METEOR 1.5 through pycocoevalcap's jar, in one long-lived Java process.

The protocol and the line formatting are pycocoevalcap's (SCORE lines per item, then one EVAL
line), so scores are the reference's; the process is started once per MetricSuite and reused.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence

from plumbing.errors import RlcapError


def meteor_jar() -> str:
    import pycocoevalcap.meteor.meteor as meteor_module

    return os.path.join(os.path.dirname(os.path.abspath(meteor_module.__file__)), "meteor-1.5.jar")


def meteor_unavailable_reason() -> str | None:
    if shutil.which("java") is None:
        return "METEOR needs Java (no `java` on PATH)"
    if not os.path.exists(meteor_jar()):
        return f"METEOR jar not found at {meteor_jar()}"
    return None


class Meteor:
    def __init__(self) -> None:
        reason = meteor_unavailable_reason()
        if reason:
            raise RlcapError(reason)
        self._proc = self._start()
        self._lock = threading.Lock()
        atexit.register(self.close)

    @staticmethod
    def _start() -> subprocess.Popen:
        jar = meteor_jar()
        return subprocess.Popen(
            ["java", "-jar", "-Xmx2G", jar, "-", "-", "-stdio", "-l", "en", "-norm"],
            cwd=os.path.dirname(jar), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )

    def _ask(self, line: str) -> str:
        self._proc.stdin.write((line + "\n").encode("utf-8"))
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline()
        if not answer:
            raise RlcapError("the METEOR process ended unexpectedly")
        return answer.decode("utf-8").strip()

    def score(self, candidates: Sequence[str], references: Sequence[Sequence[str]]) -> tuple[float, list[float]]:
        """(corpus, per item) METEOR of tokenised candidates against tokenised references."""
        if not candidates:
            return 0.0, []
        with self._lock:
            if self._proc.poll() is not None:  # the Java process died (a failed call): start a new one
                self._proc = self._start()
            stats = []
            for cand, refs in zip(candidates, references, strict=True):
                cand = cand.replace("|||", "").replace("  ", " ")
                stats.append(self._ask(" ||| ".join(("SCORE", " ||| ".join(refs), cand))))
            per_item = [float(self._ask("EVAL ||| " + " ||| ".join(stats)))]
            per_item += [float(self._proc.stdout.readline().strip()) for _ in range(len(stats) - 1)]
            corpus = float(self._proc.stdout.readline().strip())
        return corpus, per_item

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.kill()
            self._proc.wait()
