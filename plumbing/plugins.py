"""A user's own rewards and metrics: modules a config names under `plugins`, imported before the reward
bank and the metric suite are built, so that their `register_reward` / `register_metric` calls have run.
The working directory is searched as `python -m` searches it, for console scripts too."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable

from plumbing.errors import ConfigError


def import_plugins(modules: Iterable[str]) -> None:
    modules = list(modules)
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"plugins: cannot import {name!r} ({exc}); give a module importable from the working "
                              "directory or PYTHONPATH, e.g. my_rewards for ./my_rewards.py") from None
