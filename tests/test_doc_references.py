"""No stale references: every file a code comment, config or doc cites by name (a document such as
`DESIGN.md` or `docs/coco.md`, or a path under one of the repository's folders) is in the repository.
Lower-case bare names such as `summary.md` are outputs the commands write, not citations."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("captioner", "rewards", "features", "plumbing", "scripts", "configs", "tests", "docs")
SCANNED = {"captioner": "*.py", "rewards": "*.py", "features": "*.py", "plumbing": "*.py", "scripts": "*",
           "tests": "*.py", "configs": "*.yaml", "docs": "*.md"}
MARKDOWN = re.compile(r"(?<![\w/.-])((?:docs/[A-Za-z0-9_-]+|[A-Z][A-Za-z0-9_-]*)\.md)\b")
REPO_PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(FOLDERS)})/[A-Za-z0-9_/.-]*[A-Za-z0-9_]\.(?:py|md|yaml|sh|json))\b")


def scanned_files(root: Path) -> list[Path]:
    files = [root / "README.md"] if (root / "README.md").exists() else []
    for folder, pattern in SCANNED.items():
        files += sorted(p for p in (root / folder).rglob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    return [f for f in files if f.resolve() != Path(__file__).resolve()]  # this test names missing files on purpose


def stale_references(root: Path) -> list[str]:
    """'file:line: cited' for every cited file that is not there (a bare `*.md` may live in docs/)."""
    stale = []
    for path in scanned_files(root):
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for cited in {*MARKDOWN.findall(line), *REPO_PATH.findall(line)}:
                if not ((root / cited).exists() or (root / "docs" / cited).exists()):
                    stale.append(f"{path.relative_to(root)}:{number}: {cited}")
    return stale


def test_no_comment_or_doc_cites_a_missing_file():
    assert stale_references(ROOT) == []


def test_a_comment_naming_a_missing_md_file_is_found(tmp_path):
    (tmp_path / "rewards").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("see docs/coco.md and rewards/gone.py\n")
    (tmp_path / "rewards" / "formulas.py").write_text('"""The formulas (DESIGN.md, "Metric names")."""\n'
                                                      "# results.md holds the tables\n")
    assert sorted(stale_references(tmp_path)) == [
        "docs/results.md:1: docs/coco.md", "docs/results.md:1: rewards/gone.py", "rewards/formulas.py:1: DESIGN.md"]
