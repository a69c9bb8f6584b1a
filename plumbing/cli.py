"""Shared command-line plumbing: flags made from a config dataclass, and one error path.

Every command reads its settings in one order: the `--config` YAML file, then the flags given on
the command line (one per config field, made here from the dataclass and its `option(help=...)`
text), then `--set key=value` overrides. `command` turns an RlcapError into one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import functools
import json
import os
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from plumbing.atomic import write_json
from plumbing.config import apply_overrides, build, field_default, load_yaml, merge, read_yaml
from plumbing.errors import RlcapError

T = TypeVar("T")
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
_DEST = "cfg__"  # argparse dest prefix of field flags, so they never clash with --config / --set


@dataclasses.dataclass
class FieldFlag:
    path: tuple[str, ...]  # the field's keys from the config root, e.g. ("decode", "beam_size")
    tp: Any  # its type hint, optional unwrapped
    help: str
    default: Any


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="YAML config file (may `inherit: base.yaml`); flags and --set override it")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key, e.g. --set seed=3 or --set a.b=c (repeatable; applied last)",
    )


def config_parser(cls: type, prog: str, description: str | None = None) -> argparse.ArgumentParser:
    """A parser with --config, --set and one flag per field of `cls`."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flags(parser, cls)
    return parser


def add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """--config, --set and the field flags of `cls` on an existing (sub)parser."""
    add_config_args(parser)
    sections: dict[str, argparse._ArgumentGroup] = {}
    for spec in field_flags(cls):
        _add_flag(_section_group(parser, cls, spec[0].path, sections), spec)
    parser.set_defaults(config_class=cls)


def _section_group(parser: argparse.ArgumentParser, cls: type, path: tuple[str, ...],
                   sections: dict[str, argparse._ArgumentGroup]) -> argparse.ArgumentParser | argparse._ArgumentGroup:
    """A flattened section's flags are listed under their own heading in --help, after the general ones."""
    if len(path) < 2:
        return parser
    if path[0] not in sections:
        field = next(f for f in dataclasses.fields(cls) if f.name == path[0])
        about = textwrap.fill(field.metadata.get("help", ""), 100, initial_indent="  ", subsequent_indent="  ")
        sections[path[0]] = parser.add_argument_group(f"{path[0]} options", about or None)
    return sections[path[0]]


def field_flags(cls: type, prefix: tuple[str, ...] = ()) -> Iterator[tuple[FieldFlag, dataclasses.Field]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata
        tp = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            if meta.get("flatten"):
                yield from field_flags(tp, (*prefix, f.name))
            continue
        if not meta.get("flag", True) or not _flaggable(tp):
            continue
        yield FieldFlag((*prefix, f.name), tp, meta.get("help", ""), field_default(f)), f


def _add_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
              item: tuple[FieldFlag, dataclasses.Field]) -> None:
    spec, f = item
    dest = _DEST + "__".join(spec.path)
    shown = "" if spec.default in (None, "", []) else f" (default: {_show(spec.default)})"
    kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": (spec.help + shown).strip() or None}
    if typing.get_origin(spec.tp) is Literal:
        kwargs["choices"] = [str(a) for a in typing.get_args(spec.tp)]
    if f.metadata.get("positional"):
        parser.add_argument(dest, nargs="?", metavar=spec.path[-1], **{k: v for k, v in kwargs.items() if k != "dest"})
        return
    flag = f.metadata.get("flag")
    name = flag if isinstance(flag, str) else "--" + spec.path[-1].replace("_", "-")
    if spec.tp is bool:
        parser.add_argument(name, action=argparse.BooleanOptionalAction, **kwargs)
    elif _repeatable(spec, f):  # a list flag given twice keeps both: `--x a --x b` is `--x a,b`
        parser.add_argument(name, action="append", metavar="A,B,...", **kwargs)
    else:
        parser.add_argument(name, metavar=None if "choices" in kwargs else spec.path[-1].upper(), **kwargs)


def _repeatable(spec: FieldFlag, f: dataclasses.Field) -> bool:
    """List fields, and text fields that hold a comma list (`option(comma_list=True)`)."""
    return typing.get_origin(spec.tp) in (list, tuple) or bool(f.metadata.get("comma_list"))


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) == 1:
            return options[0]
    return tp


def _flaggable(tp: Any) -> bool:
    if tp in (str, int, float, bool) or typing.get_origin(tp) is Literal:
        return True
    if typing.get_origin(tp) in (list, tuple):
        args = typing.get_args(tp)
        return bool(args) and args[0] in (str, int, float)
    return False


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The field flags given on the command line, as a nested dict of raw values."""
    cls = getattr(args, "config_class", None)
    out: dict[str, Any] = {}
    if cls is None:
        return out
    for spec, _ in field_flags(cls):
        value = getattr(args, _DEST + "__".join(spec.path), None)
        if value is None:
            continue
        node = out
        for key in spec.path[:-1]:
            node = node.setdefault(key, {})
        node[spec.path[-1]] = _flag_value(spec, value)
    return out


def _flag_value(spec: FieldFlag, value: Any) -> Any:
    """Flags arrive as strings: numbers are read as YAML, lists as comma lists (a repeated list flag
    arrives as one string per time it was given, and they join), text stays text."""
    if isinstance(value, list):
        value = ",".join(value)
        if typing.get_origin(spec.tp) not in (list, tuple):  # a comma-list text field
            return ",".join(p.strip() for p in value.split(",") if p.strip())
    if isinstance(value, bool) or spec.tp is str or typing.get_origin(spec.tp) is Literal:
        return value
    if typing.get_origin(spec.tp) in (list, tuple):
        item = typing.get_args(spec.tp)[0]
        parts = [p.strip() for p in value.split(",") if p.strip()]
        return parts if item is str else [_scalar(p) for p in parts]
    return _scalar(value)


def _scalar(text: str) -> Any:
    try:
        return load_yaml(text)
    except Exception:  # noqa: BLE001 - not YAML: the typed build() names the key and the value
        return text


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Config file, then the field flags given, then --set overrides; checked against `cls`."""
    data = read_yaml(args.config, cls) if getattr(args, "config", None) else {}
    data = merge(data, given_flags(args), cls)
    data = apply_overrides(data, getattr(args, "overrides", []))
    return build(cls, data)


def parse_config(cls: type[T], parser: argparse.ArgumentParser,
                 argv: Sequence[str] | None) -> tuple[T, argparse.Namespace]:
    args = parser.parse_args(argv)
    return config_from_args(cls, args), args


def print_result(tables: str, result: dict, out: str | None = None) -> None:
    """A measuring command's ending: its tables for the reader, the result as JSON at `out` (written
    atomically) when given, and the result as the last line printed, for scripts."""
    print(tables)
    if out:
        write_json(out, result, indent=2)
    print(json.dumps(result))


def command(main: Callable[[Sequence[str] | None], int | None]) -> Callable[[Sequence[str] | None], int]:
    """Wrap a command's main: every failure is one line on stderr (what failed, the path or key,
    what to do) and exit status 2; Ctrl-C is 130. RLCAP_DEBUG=1 shows the traceback instead."""

    @functools.wraps(main)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        try:
            return int(main(argv) or 0)
        except KeyboardInterrupt:
            print("interrupted; partial outputs are kept under *.partial names for resuming", file=sys.stderr)
            return EXIT_INTERRUPTED
        except Exception as exc:  # noqa: BLE001 - the one error path of every command
            if os.environ.get("RLCAP_DEBUG") == "1":
                raise
            print(f"error: {describe_error(exc)}", file=sys.stderr)
            return EXIT_ERROR

    return wrapper


def describe_error(exc: BaseException) -> str:
    """One line for the user: the project's own errors as they are, the others named by kind."""
    if isinstance(exc, RlcapError):
        return one_line(exc)
    if isinstance(exc, OSError):
        return _os_error(exc)
    kind = type(exc).__name__
    module = type(exc).__module__
    if kind == "SafetensorError":
        return f"a safetensors file is corrupt or truncated ({one_line(exc)}); re-create or re-download it"
    if kind in ("DecompressionBombError", "DecompressionBombWarning"):
        return f"an image is too large to decode safely ({one_line(exc)})"
    if module.startswith("PIL"):
        return f"cannot read an image ({kind}: {one_line(exc)})"
    if isinstance(exc, MemoryError):
        return "out of memory; lower the batch size (--set ...batch_size=...) or the number of workers"
    if _torch_out_of_memory(exc):
        return (f"out of memory ({one_line(exc, 160)}); lower the batch size (--set ...batch_size=...), the beam "
                "size or the number of workers")
    return (f"{kind}: {one_line(exc)} (this is not an error rlcap names; RLCAP_DEBUG=1 shows the traceback, "
            "please report it)")


def _torch_out_of_memory(exc: BaseException) -> bool:
    """torch's GPU OutOfMemoryError, or its CPU allocator's RuntimeError (no torch import down here)."""
    return type(exc).__name__ == "OutOfMemoryError" or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def _os_error(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else "a file"
    if exc.errno == errno.ENOSPC:
        need = getattr(exc, "bytes_needed", None)
        amount = f"; about {need} bytes more are needed" if need else ""
        return (f"no space left on the device while writing {where}{amount}; free disk space and re-run "
                "(finished outputs are kept, partial ones resume)")
    if exc.errno == errno.EROFS:
        return f"{where} is on a read-only file system; write to another place (e.g. --out or --set run.out_dir=...)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied: {where}; choose a place you can write to, or fix its permissions"
    if exc.errno == errno.ENOENT:
        return f"file or folder not found: {where}"
    if exc.errno == errno.EISDIR:
        return f"{where} is a directory, not a file"
    return f"cannot read or write {where}: {exc.strerror or one_line(exc)}"


def one_line(exc: BaseException, limit: int = 1000) -> str:
    """The message on one line (lines joined), cut to `limit` characters."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
