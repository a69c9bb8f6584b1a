"""pycocoevalcap's Java PTBTokenizer, for users who want the reference path bit for bit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from plumbing.errors import RlcapError
from plumbing.ptb import PUNCTUATIONS

TOKENIZER_CLASS = "edu.stanford.nlp.process.PTBTokenizer"
# Every character the tokenizer's -preserveLines reads as a line end. pycocoevalcap replaces only
# "\n", so a caption holding "\r" or U+2028 shifts every later caption onto another's line there.
LINE_BREAKS = re.compile("[\n\r\x0b\x0c\u2028\u2029]")


def corenlp_jar() -> Path:
    import pycocoevalcap.tokenizer.ptbtokenizer as tok_pkg

    return Path(tok_pkg.__file__).parent / "stanford-corenlp-3.4.1.jar"


def java_available() -> bool:
    return shutil.which("java") is not None and corenlp_jar().exists()


def java_ptb_tokenize(texts: Sequence[str]) -> list[str]:
    """Tokenise with the Java tokenizer exactly as pycocoevalcap does (one line per caption)."""
    if not java_available():
        raise RlcapError("the Java PTB tokenizer needs `java` on PATH and pycocoevalcap's CoreNLP jar")
    if not texts:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "captions.txt")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("\n".join(LINE_BREAKS.sub(" ", t) for t in texts))
        cmd = ["java", "-cp", str(corenlp_jar()), TOKENIZER_CLASS, "-preserveLines", "-lowerCase", path]
        result = subprocess.run(cmd, capture_output=True, check=True)
    lines = result.stdout.decode("utf-8").split("\n")
    if len(lines) < len(texts):
        raise RlcapError(f"the Java PTB tokenizer returned {len(lines)} lines for {len(texts)} captions")
    return [" ".join(w for w in line.rstrip().split(" ") if w not in PUNCTUATIONS) for line in lines[: len(texts)]]
