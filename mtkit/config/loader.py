"""One strict YAML loader for the schema (:mod:`mtkit.config.schema`).

A recipe is a YAML mapping with the sections ``data``, ``model``, ``train``,
``decode`` (and an optional ``expected`` block that documents the score a
recipe should reach). Every key is checked: an unknown or misspelt key is an
error that names its dotted path and the closest valid key; a value of the
wrong type is an error that names the key and the expected type. Command-line
overrides (``train.max_steps=100``) pass through the same check.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from mtkit.config.schema import PRESETS, Config, ConfigError, ModelConfig, validate
from mtkit.errors import MtkitError, shown
from mtkit.io import MAX_RECIPE_BYTES, atomic_write_text, check_depth, read_bounded


def _closest(key: str, valid: typing.Iterable[str]) -> str:
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.0)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


FINITE_RULE = "must be a finite number (not nan or inf)"


def check_finite(name: str, value: Any) -> float:
    """``value`` as a float, or :class:`MtkitError` naming ``name`` (a flag, a key) when it is nan or
    infinite (or a number too large for a float): what every float mtkit reads goes through."""
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float's range
        number = math.inf
    if not math.isfinite(number):
        raise MtkitError(f"{name}: {FINITE_RULE}, got {shown(value)}")
    return number


class Plain(str):
    """A scalar as the user typed it, unquoted, in a recipe or a ``--set``: its type comes from the
    schema, never from YAML's guess (``src_lang: no`` is Norwegian, a file named ``1.50`` a string)."""


def _implied(value: Plain) -> Any:
    """What YAML would make of a plain scalar (for the schema's bool, int and float fields)."""
    if not value.strip():
        return None
    try:
        return yaml.safe_load(value)
    except (yaml.YAMLError, ValueError):  # ValueError: an integer of more than 4300 digits
        return str(value)


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return the typed value."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and (value is None or (isinstance(value, Plain) and _implied(value) is None)):
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ConfigError as e:
                errors.append(e)
        raise errors[0] if len(errors) == 1 else ConfigError(path, f"expected {_type_name(tp)}, got {shown(value)}")
    if isinstance(value, Plain) and tp in (bool, int, float):
        value = _implied(value)
    if origin is Literal:
        if value not in typing.get_args(tp):
            got = shown(str(value) if isinstance(value, str) else value)  # a Plain as a str
            raise ConfigError(path, f"expected one of {_type_name(tp)}, got {got}")
        return str(value) if isinstance(value, str) else value
    if origin is tuple and len(typing.get_args(tp)) == 2 and typing.get_args(tp)[1] is Ellipsis:
        item = typing.get_args(tp)[0]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected a list, got {shown(value)}")
        return tuple(_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(path, f"expected a list of {len(args)} values, got {shown(value)}")
        return tuple(_convert(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {shown(value)}")
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {shown(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {shown(value)}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 5e-4 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {shown(value)}")
        try:
            check_finite(path, value)
        except MtkitError:
            raise ConfigError(path, f"{FINITE_RULE}, got {shown(value)}") from None
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(path, f"expected a string, got {shown(value)}")
        return str(value)
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a bug, not a user error


def _build(cls: type, raw: dict, path: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    preset = _convert(raw.get("preset"), str | None, f"{path}.preset") if cls is ModelConfig else None
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"{path}.preset", f"unknown preset {shown(preset)}{_closest(preset, PRESETS)}")
        raw = {**PRESETS[preset], **raw}
    for key, value in raw.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise ConfigError(dotted, f"unknown config key{_closest(str(key), names)}")
        kwargs[str(key)] = _convert(value, hints[key], dotted)
    return cls(**kwargs)


def config_from_dict(raw: dict | None) -> Config:
    """Build a checked :class:`Config` from plain data (e.g. parsed YAML)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise MtkitError("config: the top level must be a mapping of sections")
    config = _build(Config, raw)
    validate(config)
    return config


class _RawLoader(yaml.SafeLoader):
    """A YAML loader whose plain scalars stay :class:`Plain` strings (quoted ones plain ``str``)."""

    yaml_implicit_resolvers: dict = {}


def _scalar(loader: _RawLoader, node: yaml.ScalarNode) -> str:
    text = loader.construct_scalar(node)
    return Plain(text) if node.style is None else str(text)


_RawLoader.add_constructor("tag:yaml.org,2002:str", _scalar)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'train.max_steps=100'`` -> (['train', 'max_steps'], Plain('100')): the schema types the value.

    A value in brackets or braces is a YAML flow list or mapping (``train.betas=[0.9,0.98]``), a quoted
    one a string; anything else is taken as typed, ``#`` and all.
    """
    if "=" not in text:
        raise MtkitError(f"--set {text}: expected KEY=VALUE, e.g. train.max_steps=100")
    key, value = text.split("=", 1)
    stripped = value.strip()
    parsed: Any = Plain(stripped)
    if stripped[:1] in ("[", "{", "'", '"'):
        try:
            parsed = yaml.load(stripped, Loader=_RawLoader)  # noqa: S506 (a safe loader)
        except yaml.YAMLError:
            raise MtkitError(f"--set {text}: malformed value") from None
    return key.strip().split("."), parsed


def _set(raw: dict, keys: list[str], value: Any) -> None:
    node = raw
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[keys[-1]] = value


def apply_overrides(raw: dict, overrides: typing.Sequence[str]) -> dict:
    """Return a copy of ``raw`` with each ``KEY=VALUE`` override set."""
    raw = copy.deepcopy(raw) if raw else {}
    for text in overrides:
        _set(raw, *parse_override(text))
    return raw


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping (plain scalars as :class:`Plain`); errors name the file and line."""
    path = Path(path)
    if path.is_dir():
        raise MtkitError(f"{path}: is a directory, expected a YAML recipe file")
    data = read_bounded(path, MAX_RECIPE_BYTES, "YAML recipe")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MtkitError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        # Aliases share one object (PyYAML never copies them), and every walk over the result (the
        # depth check, the schema, messages through shown()) visits each object once or is bounded,
        # so a "billion laughs" recipe costs the work of its size.
        raw = yaml.load(text, Loader=_RawLoader)  # noqa: S506 (a safe loader)
        check_depth(raw, str(path))
    except RecursionError:  # PyYAML's composer recurses once per level
        raise MtkitError(f"{path}: nested too deep") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise MtkitError(f"{path}:{where}: malformed YAML: {problem}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MtkitError(f"{path}: expected a mapping of sections (data, model, train, decode)")
    return raw


def load_config(
    path: str | Path | None,
    overrides: typing.Sequence[str] = (),
    flags: typing.Mapping[str, tuple[str, Any]] | None = None,
    defaults: typing.Mapping[str, tuple[str, Any]] | None = None,
) -> Config:
    """Load a recipe (or the defaults when ``path`` is None), then apply, in this order:
    ``defaults`` ({dotted key: (flag, value)}, e.g. what ``--demo`` implies), the ``--set``
    ``overrides``, and ``flags`` ({dotted key: (flag, value)}, the command's own options, typed).

    An error names where the bad value came from: the flag, the ``--set``, or the recipe file.
    """
    recipe = read_yaml(path) if path is not None else {}
    raw = copy.deepcopy(recipe)
    origin: dict[str, str] = {}
    for dotted, (flag, value) in (defaults or {}).items():
        _set(raw, dotted.split("."), value)
        origin[dotted] = flag
    for text in overrides:
        keys, value = parse_override(text)
        _set(raw, keys, value)
        origin[".".join(keys)] = f"--set {text}"
    for dotted, (flag, value) in (flags or {}).items():
        _set(raw, dotted.split("."), value)
        origin[dotted] = flag
    try:
        return config_from_dict(raw)
    except ConfigError as e:
        key = e.key.split("[")[0]
        parts = key.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in origin:
                raise MtkitError(f"{origin['.'.join(parts[:n])]}: {e.problem}") from None
        # A key the recipe does not have, made by an override below it (a misspelt section).
        node: Any = recipe
        for part in parts:
            node = node.get(part) if isinstance(node, dict) else None
        below = [flag for dotted, flag in origin.items() if dotted.startswith(key + ".")]
        if node is None and below:
            raise MtkitError(f"{below[0]}: {e}") from None
        raise MtkitError(f"{path}: {e}" if path is not None else str(e)) from None


def config_to_dict(config: Any) -> dict:
    """Plain data (tuples become lists) for YAML/JSON/checkpoints."""

    def plain(value: Any) -> Any:
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(config))


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically."""
    atomic_write_text(path, yaml.safe_dump(config_to_dict(config), sort_keys=False))


def override_section(value: Any, section: str, changes: dict) -> Any:
    """A copy of one config section (e.g. ``decode``) with ``changes``, through the recipe's strict checks."""
    if not changes:
        return value
    return getattr(config_from_dict({section: {**config_to_dict(value), **changes}}), section)


def saved_decode(raw: Any, where: str | Path) -> Any:
    """A decode section kept in a file (an export's ``mtkit.json``) as a DecodeConfig, through the recipe's
    checks: the defaults where there is none, a one-line error naming ``where`` for one that fails them."""
    if raw is None:
        return config_from_dict({}).decode
    if not isinstance(raw, dict):
        raise MtkitError(f"{where}: 'decode' must be an object, got {shown(raw)}")
    try:
        return config_from_dict({"decode": raw}).decode
    except MtkitError as e:
        raise MtkitError(f"{where}: {e}") from None
