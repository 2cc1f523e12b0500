"""Turning override values and environment strings into a parameter's declared type.

Overrides are Python values and must already have the declared type (an ``int`` is accepted for
a ``float``); composite values may also be given as a mapping of their fields, which is what a
JSON tenant record holds. Environment strings are parsed: numbers, ``true``/``false``, ``null``
for an unset optional, and JSON for composites (``{"count": 20, "period_ms": 1000}``).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from qim.params.errors import ParamValueError
from qim.params.param import Param

__all__ = ["coerce_override", "parse_env"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NULL = frozenset({"null", "none"})


def coerce_override(param: Param[Any], raw: object) -> object:
    """Check ``raw`` against ``param``'s type and bounds; return the value to store."""
    if raw is None:
        if param.nullable:
            return None
        raise ParamValueError(f"{param.name}: None is not allowed (default {param.default!r})")
    value = _decode(param.declared_type, raw, param.name)
    _check_bounds(param, value)
    return value


def parse_env(param: Param[Any], variable: str, text: str) -> object:
    """Parse the environment variable ``variable``'s ``text`` as ``param``'s declared type."""
    where = f"{variable} (for {param.name})"
    stripped = text.strip()
    if param.nullable and stripped.lower() in _NULL:
        return None
    expected = param.declared_type
    raw: object
    if expected is bool:
        lowered = stripped.lower()
        if lowered not in _TRUE | _FALSE:
            raise ParamValueError(f"{where}: expected true/false, got {text!r}")
        raw = lowered in _TRUE
    elif expected is int:
        try:
            raw = int(stripped)
        except ValueError:
            raise ParamValueError(f"{where}: expected an integer, got {text!r}") from None
    elif expected is float:
        try:
            raw = float(stripped)
        except ValueError:
            raise ParamValueError(f"{where}: expected a number, got {text!r}") from None
    elif expected is str:
        raw = stripped
    else:
        try:
            raw = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ParamValueError(
                f"{where}: expected a JSON object for {expected.__name__}, got {text!r} ({exc})"
            ) from None
    try:
        return coerce_override(param, raw)
    except ParamValueError as exc:
        raise ParamValueError(f"{variable}: {exc}") from None


def _check_bounds(param: Param[Any], value: object) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if param.minimum is not None and value < param.minimum:
            raise ParamValueError(f"{param.name}: {value!r} is below the minimum {param.minimum}")
        if param.maximum is not None and value > param.maximum:
            raise ParamValueError(f"{param.name}: {value!r} is above the maximum {param.maximum}")
    if param.choices and value not in param.choices:
        raise ParamValueError(f"{param.name}: {value!r} is not one of {list(param.choices)}")


def _decode(tp: Any, raw: object, where: str) -> object:
    """Check ``raw`` against the annotation ``tp``, building dataclasses from mappings."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        if raw is None and len(members) < len(typing.get_args(tp)):
            return None
        if len(members) != 1:
            raise TypeError(f"unsupported annotation {tp!r}")
        return _decode(members[0], raw, where)
    if origin is tuple:
        item_type, ellipsis = typing.get_args(tp)
        if ellipsis is not Ellipsis:
            raise TypeError(f"unsupported annotation {tp!r}")
        if not isinstance(raw, list | tuple):
            raise ParamValueError(f"{where}: expected a list, got {raw!r}")
        return tuple(_decode(item_type, item, f"{where}[{i}]") for i, item in enumerate(raw))
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        raise ParamValueError(f"{where}: expected a bool, got {raw!r}")
    if tp is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        raise ParamValueError(f"{where}: expected an int, got {raw!r}")
    if tp is float:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        raise ParamValueError(f"{where}: expected a number, got {raw!r}")
    if tp is str:
        if isinstance(raw, str):
            return raw
        raise ParamValueError(f"{where}: expected a string, got {raw!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, raw, where)
    raise TypeError(f"unsupported annotation {tp!r}")


def _decode_dataclass(cls: type[Any], raw: object, where: str) -> object:
    if isinstance(raw, cls):
        return raw
    if not isinstance(raw, Mapping):
        raise ParamValueError(f"{where}: expected {cls.__name__} or a mapping, got {raw!r}")
    names = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(map(str, raw)) - set(names))
    missing = [name for name in names if name not in raw]
    if unknown or missing:
        raise ParamValueError(
            f"{where}: {cls.__name__} takes exactly {names}; unknown {unknown}, missing {missing}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {name: _decode(hints[name], raw[name], f"{where}.{name}") for name in names}
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ParamValueError(f"{where}: {exc}") from None
