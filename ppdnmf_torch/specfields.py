"""Specs whose fields carry their rules: a setting's default, type, range and choices written once.

A model's spec (``models/<name>/config.py``) is a frozen dataclass of settings; each field is
made by :func:`rule` (its range ``gt``/``ge``/``le``, its string ``choices``) and typed by its
annotation (``int``, ``float``, ``str``, ``bool``, ``X | None``, ``list[float]`` for one value
per trial, and unions such as ``float | str`` for ``"auto"`` or a number). :func:`check_fields`
(called from the spec's ``__post_init__``) refuses a value of the wrong type instead of
converting it: ``"2"`` for an integer, ``2.5`` or ``2.0`` for an integer, ``True`` for a number,
``"float16"`` outside the choices; an integer is taken for a float (and stored as a float). Every
error is one :class:`~ppdnmf_torch.errors.ConfigError` naming the field (``key: reason``).

:func:`build` makes a dataclass (a spec, or an app's run config holding specs) from a nested
mapping, such as a composed config or a run folder's ``config.yaml``: unknown keys are
errors, missing keys take the defaults, nested dataclasses are built in turn, and errors name
the dotted key (``solver.max_iter``). With ``integral_floats`` (what a config file or the command
line gives: ``max_iter=1e3`` is read as a float) an integral float is taken for an integer.

The field metadata is the same as the PPDNMF config's (``gt``, ``ge``, ``le``, ``choices``,
``doc``), so a field of either kind is checked the same way. Standard library only.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, field, fields, is_dataclass

from .errors import ConfigError, PPDNMFError

__all__ = ["rule", "check_fields", "build", "defaults", "replace"]


def rule(default=MISSING, *, default_factory=MISSING, gt=None, ge=None, le=None, choices=None, doc: str = "",
         build_with=None):
    """A dataclass field with its rule: numbers in the range (``gt``, ``ge``, ``le``), strings among
    ``choices``; ``build_with(value, key)``, optional, makes the field's value from a config entry
    (an object that is not a plain value, such as an exchange spec)."""
    meta = {"gt": gt, "ge": ge, "le": le, "choices": tuple(choices) if choices is not None else None, "doc": doc,
            "build_with": build_with}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _options(tp) -> tuple:
    """``(types, nullable)`` of an annotation (``int | None`` -> ``((int,), True)``)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = tuple(a for a in args if a is not type(None))
        return inner, len(inner) != len(args)
    return (tp,), tp is type(None)


def _wanted(options, meta) -> str:
    words = []
    for t in options:
        if typing.get_origin(t) is list:
            words.append("a list of numbers (one per trial)")
        elif t is bool:
            words.append("true or false")
        elif t is int:
            words.append("an integer")
        elif t is float:
            words.append("a number")
        elif t is str:
            choices = meta.get("choices")
            words.append(f"one of {', '.join(map(str, choices))}" if choices else "a string")
        else:
            words.append(getattr(t, "__name__", str(t)))
    return " or ".join(dict.fromkeys(words))


def _check_range(key: str, v, meta) -> None:
    gt, ge, le = meta.get("gt"), meta.get("ge"), meta.get("le")
    if gt is not None and not v > gt:
        raise ConfigError(f"{key}: must be > {gt:g}, got {v!r}")
    if ge is not None and not v >= ge:
        raise ConfigError(f"{key}: must be >= {ge:g}, got {v!r}")
    if le is not None and not v <= le:
        raise ConfigError(f"{key}: must be <= {le:g}, got {v!r}")


def _scalar(key: str, v, options, meta, integral_floats: bool, shown=None):
    """``v`` checked against the scalar types of ``options``; returns it (an int taken for a
    float becomes a float) or raises naming ``key`` (and what ``shown``, default ``options``, allows)."""
    if isinstance(v, bool):
        if bool in options:
            return v
    elif isinstance(v, numbers.Integral):  # a NumPy integer too, stored as an int
        if int in options:
            _check_range(key, int(v), meta)
            return int(v)
        if float in options:
            _check_range(key, v, meta)
            return float(v)
    elif isinstance(v, float):
        if float in options and not math.isfinite(v):
            raise ConfigError(f"{key}: must be a finite number, got {v!r}")
        if float in options:
            _check_range(key, v, meta)
            return float(v)
        if int in options and integral_floats and math.isfinite(v) and v.is_integer():
            _check_range(key, int(v), meta)
            return int(v)
    elif isinstance(v, str):
        if str in options:
            choices = meta.get("choices")
            if choices is not None and v not in choices:
                raise ConfigError(f"{key}: unknown value {v!r}; use one of {', '.join(map(str, choices))}")
            return v
    raise ConfigError(f"{key}: must be {_wanted(shown or options, meta)}, got {v!r} ({type(v).__name__})")


def check_value(key: str, v, tp, meta=None, *, integral_floats: bool = False):
    """``v`` checked against the annotation ``tp`` and the rule ``meta``; returns the value to
    store (a list stays a list; an int for a float becomes a float)."""
    meta = meta or {}
    options, nullable = _options(tp)
    if v is None:
        if nullable:
            return None
        raise ConfigError(f"{key}: is required (got null); must be {_wanted(options, meta)}")
    lists = [t for t in options if typing.get_origin(t) is list]
    if isinstance(v, (list, tuple)):
        if not lists:
            raise ConfigError(f"{key}: must be a single value ({_wanted(options, meta)}), got a list {list(v)!r}")
        if not v:
            raise ConfigError(f"{key}: the list is empty")
        elem = typing.get_args(lists[0])
        return [_scalar(f"{key}[{i}]", x, elem, meta, integral_floats) for i, x in enumerate(v)]
    scalars = tuple(t for t in options if typing.get_origin(t) is not list)
    if not scalars:
        raise ConfigError(f"{key}: must be {_wanted(options, meta)}, got {v!r} ({type(v).__name__})")
    return _scalar(key, v, scalars, meta, integral_floats, options)


def _dataclass_type(tp):
    options, _ = _options(tp)
    return options[0] if len(options) == 1 and isinstance(options[0], type) and is_dataclass(options[0]) else None


def check_fields(obj, prefix: str = "", *, integral_floats: bool = False) -> None:
    """Check every field of the dataclass ``obj`` (frozen or not) against its annotation and
    rule, nested dataclasses included; a value taken as another type (an int for a float) is
    stored as that type. Raises :class:`ConfigError` naming the first bad field."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        key, v, tp = _key(prefix, f.name), getattr(obj, f.name), hints[f.name]
        sub = _dataclass_type(tp)
        if f.metadata.get("build_with") is not None:
            continue  # its own type checks its values when made
        if sub is not None:
            if v is None and _options(tp)[1]:
                continue
            if not isinstance(v, sub):
                raise ConfigError(f"{key}: must be a {sub.__name__}, got {type(v).__name__}")
            check_fields(v, key, integral_floats=integral_floats)
            continue
        checked = check_value(key, v, tp, f.metadata, integral_floats=integral_floats)
        if checked is not v:
            object.__setattr__(obj, f.name, checked)


def build(cls, data, prefix: str = "", *, integral_floats: bool = True):
    """A ``cls`` (a dataclass) from the nested mapping ``data``: unknown keys refused, missing
    keys at their defaults, nested dataclasses built in turn; errors name the dotted key.

    Raises
    ------
    ConfigError
        ``<prefix>.<key>: reason`` for the first bad value (the spec's own cross-field rules
        included, re-rooted at ``prefix``).
    """
    if is_dataclass(data) and isinstance(data, cls):
        data = {f.name: getattr(data, f.name) for f in fields(data)}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: must be a mapping of keys to values, got {data!r}")
    names = [f.name for f in fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ConfigError(f"{_key(prefix, str(unknown[0]))}: unknown key; known keys here: {', '.join(names)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name not in data or not f.init:
            continue
        key, v, tp = _key(prefix, f.name), data[f.name], hints[f.name]
        maker, sub = f.metadata.get("build_with"), _dataclass_type(tp)
        if maker is not None:
            kwargs[f.name] = maker(v, key) if v is not None else None
        elif sub is not None:
            if v is not None:
                kwargs[f.name] = build(sub, v, key, integral_floats=integral_floats)
        else:
            kwargs[f.name] = check_value(key, v, tp, f.metadata, integral_floats=integral_floats)
    try:
        return cls(**kwargs)
    except PPDNMFError as exc:
        raise (exc.within(prefix) if prefix else exc) from None


def defaults(cls) -> dict:
    """``{field: default}`` of a spec class (a ``default_factory`` called)."""
    out = {}
    for f in fields(cls):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


def replace(obj, **changes):
    """A copy of the spec ``obj`` with ``changes`` (checked again, as any new spec)."""
    return dataclasses.replace(obj, **changes)
