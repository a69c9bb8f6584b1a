"""Typed configs: dataclasses filled from YAML files and `--set a.b=c` overrides.

A YAML file may name a base file with `inherit: base.yaml` (relative to itself); the base is
loaded first and the file's keys are merged over it, recursively. Every key must be a field of
the dataclass it lands in, and every value must match the field's type: anything else is a
ConfigError that names the key and lists the valid ones.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from plumbing.atomic import write_text
from plumbing.errors import ConfigError

T = TypeVar("T")
INHERIT_KEY = "inherit"
_BOOL_TAG = "tag:yaml.org,2002:bool"
# yes/no/on/off: words, as in YAML 1.2; a bool field still takes them (`_coerce_scalar`).
_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 booleans, so that `mixed_precision: no` stays the word
    "no": only the field's type decides whether a word means a boolean. Aliases (`*name`) are
    refused: a config never needs them, and nested ones expand exponentially (a YAML bomb)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(f"YAML aliases are not allowed in configs (*{event.anchor} at line "
                              f"{event.start_mark.line + 1}); write the value out")
        return super().compose_node(parent, index)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def option(default: Any = dataclasses.MISSING, *, help: str, factory: Callable[[], Any] | None = None,
           flag: str | bool = True, positional: bool = False, flatten: bool = False, comma_list: bool = False,
           at_least: float | None = None, above: float | None = None, at_most: float | None = None) -> Any:
    """A config field that documents itself: `help` is its --help line, and the command line gets
    a flag for it (`--the-name`, or `flag`; False for none; `positional` for a bare argument).
    A dataclass section with `flatten` gives its own fields flags without a prefix. A list field's
    flag, or a text field's with `comma_list`, keeps every value when it is given more than once.
    `at_least`, `above` and `at_most` bound a number (each item of a list of numbers); `build` checks them."""
    bounds = {k: v for k, v in (("at_least", at_least), ("above", above), ("at_most", at_most)) if v is not None}
    metadata = {"help": help, "flag": flag, "positional": positional, "flatten": flatten, "bounds": bounds,
                "comma_list": comma_list}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_default(f: dataclasses.Field) -> Any:
    """A config field's default value (its factory's product for a list or dict), or None when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def read_yaml(path: str | Path, schema: type | None = None, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config, resolving its `inherit:` chain into one dict (see `merge` for `schema`)."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(f"{path}: inherit cycle: {chain}")
    data = _parse_file(path)
    base_name = data.pop(INHERIT_KEY, None)
    if base_name is None:
        return data
    if not isinstance(base_name, str) or not base_name:
        raise ConfigError(f"{path}: 'inherit' must name a YAML file (a path relative to this one), "
                          f"got {short(base_name)}")
    base = read_yaml(path.parent / base_name, schema, (*_seen, path))
    return merge(base, data, schema)


def _parse_file(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"config {path} is a directory; give a YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); is this a YAML config?") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror or exc}") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {short(exc, 300)}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def short(value: Any, limit: int = 80) -> str:
    """repr of a value for an error message, cut to `limit` characters."""
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def merge(base: Mapping[str, Any], over: Mapping[str, Any], schema: type | None = None) -> dict[str, Any]:
    """Recursive dict merge; values of `over` win.

    With a dataclass `schema`, sections (dataclass fields) merge key by key and so do keyed
    sub-configs such as `reward_models`, but a plain mapping value such as `scst.rewards` is
    replaced whole: a file that inherits and names a reward mix means that mix, not its union
    with the base file's mix. Without a schema every nested mapping merges.
    """
    kinds = _merge_kinds(schema)
    out = dict(base)
    for key, value in over.items():
        kind, child = kinds.get(key, ("merge", None))
        if kind == "replace" or not (isinstance(value, Mapping) and isinstance(out.get(key), Mapping)):
            out[key] = value
        elif kind == "keyed":
            out[key] = _merge_entries(out[key], value, child)
        else:
            out[key] = merge(out[key], value, child)
    return out


def _merge_entries(base: Mapping[str, Any], over: Mapping[str, Any], entry: type | None) -> dict[str, Any]:
    """Keyed sub-configs (reward_models): each named entry merges with its namesake, by `entry`'s schema."""
    out = dict(base)
    for name, value in over.items():
        both = isinstance(value, Mapping) and isinstance(out.get(name), Mapping)
        out[name] = merge(out[name], value, entry) if both else value
    return out


def _merge_kinds(schema: type | None) -> dict[str, tuple[str, type | None]]:
    """Per field of a dataclass: ("merge", section), ("keyed", entry dataclass) or ("replace", None)."""
    if schema is None or not dataclasses.is_dataclass(schema):
        return {}
    kinds = {}
    for name, tp in typing.get_type_hints(schema).items():
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (Union, types.UnionType) and len(options) == 1:
            tp = options[0]
        entry = typing.get_args(tp)[1] if typing.get_origin(tp) is dict else None
        if dataclasses.is_dataclass(tp):
            kinds[name] = ("merge", tp)
        elif dataclasses.is_dataclass(entry):
            kinds[name] = ("keyed", entry)
        else:
            kinds[name] = ("replace", None)
    return kinds


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (["a", "b"], c) with c parsed as a YAML scalar/list/dict."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. --set train.lr=1e-4")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: empty key")
    try:
        value = load_yaml(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    data = dict(data)
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for key in keys[:-1]:
            child = node.get(key)
            node[key] = dict(child) if isinstance(child, Mapping) else {}
            node = node[key]
        node[keys[-1]] = value
    return data


def build(cls: type[T], data: Mapping[str, Any] | None, where: str = "") -> T:
    """Instantiate dataclass `cls` from `data`, checking keys and types."""
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = _join(where, unknown[0])
        if section := _section_holding(cls, hints, unknown[0]):
            raise ConfigError(f"config key {key!r} belongs in the {section!r} section: "
                              f"{_join(where, section)}.{unknown[0]}")
        raise ConfigError(f"unknown config key {key!r}; valid keys here: {', '.join(sorted(fields))}")
    kwargs = {name: _coerce(hints[name], data[name], _join(where, name)) for name in data}
    for name, value in kwargs.items():
        _check_bounds(fields[name].metadata.get("bounds", {}), value, _join(where, name))
    missing = [
        name for name, f in fields.items()
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required config key {_join(where, missing[0])!r}")
    return cls(**kwargs)


def _section_holding(cls: type, hints: Mapping[str, Any], key: str) -> str | None:
    """The dataclass section of `cls` that has a field `key` (a key written one level too high)."""
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and key in {g.name for g in dataclasses.fields(tp)}:
            return f.name
    return None


def _check_bounds(bounds: Mapping[str, float], value: Any, key: str) -> None:
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, (int, float)) or isinstance(item, bool):
            continue
        if "at_least" in bounds and item < bounds["at_least"]:
            raise ConfigError(f"config key {key} must be at least {bounds['at_least']:g}, got {item!r}")
        if "above" in bounds and item <= bounds["above"]:
            raise ConfigError(f"config key {key} must be greater than {bounds['above']:g}, got {item!r}")
        if "at_most" in bounds and item > bounds["at_most"]:
            raise ConfigError(f"config key {key} must be at most {bounds['at_most']:g}, got {item!r}")


def require_keys(cfg: Any, keys: Iterable[str], command: str) -> None:
    """A command's required path keys: an empty one is a ConfigError naming key and flag."""
    for key in keys:
        if not getattr(cfg, key):
            raise ConfigError(f"{command} needs {key!r} (--{key.replace('_', '-')})")


def load_config(cls: type[T], path: str | Path | None = None, overrides: Iterable[str] = ()) -> T:
    """The one entry point commands use: file (optional) + overrides -> typed config."""
    data = read_yaml(path, cls) if path else {}
    return build(cls, apply_overrides(data, overrides))


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically."""
    write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(option, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"config key {key!r}: {short(value)} matches none of {_type_name(tp)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config key {key!r}: {short(value)} is not one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r}: expected a list, got {short(value)}")
        item = args[0] if args else Any
        return [_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key {key!r}: expected a mapping, got {short(value)}")
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(val_tp, v, f"{key}.{k}") for k, v in value.items()}
    return _coerce_scalar(tp, value, key)


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "5e-4" (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"config key {key!r}: must be a finite number, got {short(value)}")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"config key {key!r}: expected {_type_name(tp)}, got {type(value).__name__} {short(value)}")
