"""Every command the README shows answers --help, takes --config and --set, knows every flag the
README gives it, and every config file the README names exists."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[tuple[str, list[str]]]:
    """(module, arguments) of every `python -m` / `accelerate launch ... -m` line in README code blocks."""
    commands = []
    for block in shell_blocks((ROOT / "README.md").read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            words = shlex.split(line, comments=True) if line else []
            if "-m" not in words or not words or words[0] not in ("python", "accelerate"):
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


COMMANDS = readme_commands()


def test_the_readme_shows_the_commands():
    modules = {m for m, _ in COMMANDS}
    assert len(COMMANDS) >= 30
    assert {"features.world", "captioner.train", "rewards.score", "rewards.meta_eval", "captioner.sweep"} <= modules


@pytest.mark.parametrize("module,args", COMMANDS, ids=[f"{m} {' '.join(a)[:40]}" for m, a in COMMANDS])
def test_readme_command_answers_help_and_knows_its_flags(module, args):
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
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), f"{module}: README shows {flag}"
    for k, word in enumerate(args[:-1]):
        if word == "--config":
            assert (ROOT / args[k + 1]).is_file(), f"{module}: README names a missing config {args[k + 1]}"
