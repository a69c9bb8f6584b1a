"""Shared command-line plumbing: config flags, and turning RlcapError into a clean exit."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from captioner.config import apply_overrides, build, merge, read_yaml
from captioner.errors import RlcapError

T = TypeVar("T")
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML config file (may `inherit:` a base file)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key, e.g. --set seed=3 (repeatable; applied last)",
    )


def config_from_args(cls: type[T], args: argparse.Namespace, flags: Mapping[str, Any] | None = None) -> T:
    """Config file, then explicit command-line flags (those not None), then --set overrides."""
    data = read_yaml(args.config, cls) if getattr(args, "config", None) else {}
    given = {key: value for key, value in (flags or {}).items() if value is not None}
    data = merge(data, given, cls)
    data = apply_overrides(data, getattr(args, "overrides", []))
    return build(cls, data)


def command(main: Callable[[Sequence[str] | None], int | None]) -> Callable[[Sequence[str] | None], int]:
    """Wrap a command's main: user errors print one line to stderr and exit non-zero."""

    @functools.wraps(main)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        try:
            return int(main(argv) or 0)
        except RlcapError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            print("interrupted; partial outputs are kept under *.partial names for resuming",
                  file=sys.stderr)
            return EXIT_INTERRUPTED

    return wrapper
