"""Every command the README and docs/*.md show answers --help, takes --config and --set, knows every
flag they give it, and every config file they name exists."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def document_commands(path: Path) -> list[tuple[str, list[str]]]:
    """(module, arguments) of every `python -m` / `accelerate launch ... -m` line in a file's code blocks."""
    commands = []
    for block in shell_blocks(path.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if not line.startswith(("python ", "accelerate ")):
                continue
            words = shlex.split(line, comments=True)
            if "-m" not in words:
                continue
            at = words.index("-m")
            commands.append((words[at + 1], words[at + 2:]))
    return commands


def shell_blocks(text: str) -> list[str]:
    """The bodies of the ```bash (or bare ```) fenced blocks."""
    blocks, current, language = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, language = [], line[3:].strip()
            else:
                if language in ("", "bash", "sh"):
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def main_of(module: str):
    """A command's main: the module's own, or for a package the one its __main__ imports."""
    spec = importlib.util.find_spec(module)
    if spec.submodule_search_locations:
        source = (Path(spec.submodule_search_locations[0]) / "__main__.py").read_text()
        module = re.search(r"from (\S+) import main", source).group(1)
    return importlib.import_module(module).main


def help_text(module: str, positionals: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        main_of(module)([*positionals, "--help"])
    assert stop.value.code == 0, f"{module} {positionals} --help exited {stop.value.code}"
    return out.getvalue()


COMMANDS = [(path.relative_to(ROOT).as_posix(), module, args) for path in DOCUMENTS
            for module, args in document_commands(path)]


def test_the_readme_and_docs_show_the_commands():
    readme = {m for doc, m, _ in COMMANDS if doc == "README.md"}
    assert len([c for c in COMMANDS if c[0] == "README.md"]) >= 25
    assert {"features.world", "captioner.train", "rewards.score", "rewards.meta_eval", "captioner.sweep"} <= readme
    shown = {doc for doc, _, _ in COMMANDS}
    assert {"docs/coco.md", "docs/results.md", "docs/reward_model_recipes.md", "docs/adding_a_reward.md"} <= shown


@pytest.mark.parametrize("doc,module,args", COMMANDS, ids=[f"{d}: {m} {' '.join(a)[:40]}" for d, m, a in COMMANDS])
def test_shown_command_answers_help_and_knows_its_flags(doc, module, args):
    positionals = []
    for word in args:
        if word.startswith("-"):
            break
        positionals.append(word)
    text = help_text(module, positionals)
    for flag in ("--config", "--set"):
        assert re.search(rf"(?<![\w-]){flag}(?![\w-])", text), f"{module}: no {flag} in --help"
    for word in args:
        flag = word.split("=")[0]
        if flag.startswith("--"):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), f"{module}: {doc} shows {flag}"
    for k, word in enumerate(args[:-1]):
        if word == "--config":
            made_by_reader = re.findall(r"[Ss]ave this as `([^`]+)`", (ROOT / doc).read_text(encoding="utf-8"))
            assert (ROOT / args[k + 1]).is_file() or args[k + 1] in made_by_reader, \
                f"{module}: {doc} names a missing config {args[k + 1]}"
