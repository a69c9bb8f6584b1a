"""The house has floors and imports only point down (docs/ARCHITECTURE.md, "Floors").

plumbing -> features.world -> features.clip_models -> features -> rewards -> captioner. Every
import of every module is read with `ast` (function-level imports included); an import of a
higher floor fails the test, and so does the captioner reaching past the rewards package's face.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"plumbing": 0, "features.world": 1, "features.clip_models": 2, "features": 3, "rewards": 4, "captioner": 5}
FACE_ONLY = {"captioner": "rewards"}  # the captioner reaches rewards only through `rewards/__init__.py`


def floor_of(module: str) -> int | None:
    best = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if best is None else FLOORS[best]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_floor(path: Path, root: Path) -> int:
    """A package's __init__ runs whenever any module inside it is imported, so it stands on the
    lowest floor of what it contains."""
    name = module_name(path, root)
    inside = [floor_of(module_name(p, root)) for p in path.parent.rglob("*.py")]
    return min([f for f in inside if f is not None] + [floor_of(name)])


def imported_modules(tree: ast.AST, name: str, is_package: bool) -> list[tuple[int, str, bool]]:
    """(line, module, names-only-from-the-package) for every import in a module."""
    found = []
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, False) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base, True))
    return found


def upward_imports(root: Path) -> list[str]:
    problems = []
    paths = sorted(p for pkg in ("plumbing", "features", "rewards", "captioner") for p in (root / pkg).rglob("*.py"))
    for path in paths:
        name = module_name(path, root)
        own = package_floor(path, root) if path.name == "__init__.py" else floor_of(name)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, target, _ in imported_modules(tree, name, path.name == "__init__.py"):
            theirs = floor_of(target)
            where = f"{path.relative_to(root)}:{line}"
            if theirs is not None and theirs > own:
                problems.append(f"{where}: {name} (floor {own}) imports {target} (floor {theirs})")
            top = name.split(".")[0]
            face = FACE_ONLY.get(top)
            if face and target.startswith(face + "."):
                problems.append(f"{where}: {name} reaches past the {face} package's face: {target}")
    return problems


def test_no_module_imports_a_higher_floor():
    assert upward_imports(ROOT) == []


def test_the_checker_finds_an_upward_import(tmp_path):
    for pkg in FLOORS:
        folder = tmp_path / pkg.replace(".", "/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
    (tmp_path / "plumbing" / "bad.py").write_text("def f():\n    from captioner.train import Trainer\n")
    (tmp_path / "features" / "world" / "bad.py").write_text("import rewards\n")
    (tmp_path / "features" / "__init__.py").write_text("from features.extract import extract\n")
    (tmp_path / "captioner" / "bad.py").write_text("from rewards.text.cider import CiderD\n")
    (tmp_path / "rewards" / "text").mkdir()
    (tmp_path / "rewards" / "text" / "ok.py").write_text("from ..context import ScoringContext\n")
    problems = upward_imports(tmp_path)
    assert any("plumbing.bad (floor 0) imports captioner.train (floor 5)" in p for p in problems)
    assert any("features.world.bad (floor 1) imports rewards (floor 4)" in p for p in problems)
    assert any("features (floor 1) imports features.extract (floor 3)" in p for p in problems)
    assert any("reaches past the rewards package's face: rewards.text.cider" in p for p in problems)
    assert not any("rewards.text.ok" in p for p in problems)
    assert len(problems) == 4


def test_lower_floors_import_without_the_floors_above():
    code = ("import sys, plumbing, features.world, features.clip_models.factory, features.extract, rewards;"
            "import rewards.bank, rewards.suite, rewards.score, rewards.meta_eval;"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'captioner');"
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
