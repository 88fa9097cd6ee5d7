"""Settings that carry their rules: dataclass fields with a type, a range and choices, checked once.

Every model's spec (``models/<name>/config.py``) and the app's configs are dataclasses whose
fields are declared with :func:`rule`: the annotation is the type (``int``, ``float``, ``str``,
``bool``, ``X | None``, ``list[float]`` for one value per trial, unions such as ``float | str``
for ``"auto"`` or a number, and classes such as ``torch.device``), the rule's ``gt``/``ge``/``le``
the range, ``choices`` the allowed strings, ``check`` a custom test where an annotation cannot
say it, ``build`` how a config entry becomes a nested spec of its own kind. Two ways in, one set
of rules:

* from Python (a model's ``fit``, its estimator): :func:`check_fields` in the dataclass's
  ``__post_init__`` refuses a value of the wrong type, never converts it (``"0.1"`` for a
  number, ``2.0`` or ``True`` for an integer, ``"no"`` for a flag); the one widening kept is an
  integer for a number, stored as a ``float`` (a NumPy integer for an integer is an ``int``);
* from a function's keywords (symmetric NMF's and FSSPCA's functions): :func:`check_call`
  checks each keyword that is a spec's field against that field's rule, once at the boundary,
  without storing anything (the function goes on with the values as given);
* from a config (Hydra's composed dict, a run folder's ``config.yaml``): :func:`build`
  converts what text formats cannot keep apart (an integral ``1e3`` for an integer, a list for
  a tuple), names the dotted key of a bad value, and then builds the dataclass, whose own check
  runs as above; :func:`check_dataclass` re-checks a built config in place.

Every error is a :class:`~ppdnmf_torch.errors.ConfigError` that starts with the key:
``"solver.mu: must be > 0, got -1.0"``. Nothing here knows a model; standard library only.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, asdict, field, fields, is_dataclass

from .errors import ConfigError, PPDNMFError

__all__ = ["rule", "check_fields", "check_value", "check_call", "build", "check_dataclass", "to_plain", "coerce",
           "describe", "defaults", "replace"]


def rule(default=MISSING, *, default_factory=MISSING, gt=None, ge=None, le=None, choices=None, check=None,
         build=None, doc: str = ""):
    """A dataclass field that carries its rules.

    Parameters
    ----------
    default, default_factory
        As :func:`dataclasses.field`.
    gt, ge, le : number, optional
        The range of a number (of every element of a list).
    choices : tuple of str, optional
        The allowed values of a string.
    check : callable, optional
        ``check(key, value) -> value``: a test the annotation cannot express (it replaces the
        type and range check of the value, not None's).
    build : callable, optional
        ``build(value, key) -> value``: how a config value becomes this field's (a nested
        spec of its own kind, e.g. an exchange section); used by :func:`build` and
        :func:`check_dataclass`.
    doc : str
        One line on what the setting is.
    """
    meta = {"gt": gt, "ge": ge, "le": le, "choices": choices, "check": check, "build": build, "doc": doc}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _hints(cls) -> dict:
    cached = cls.__dict__.get("__spec_hints__")
    if cached is None:
        cached = typing.get_type_hints(cls)
        setattr(cls, "__spec_hints__", cached)  # noqa: B010 - per class, computed once
    return cached


def _split_optional(tp):
    """``(inner types, nullable)`` of an annotation such as ``int | None``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = tuple(a for a in args if a is not type(None))
        return inner, len(inner) != len(args)
    return (tp,), tp is type(None)


def _is_sequence_type(tp) -> bool:
    return typing.get_origin(tp) in (list, tuple)


def _element_type(tp):
    args = [a for a in typing.get_args(tp) if a is not Ellipsis]
    return args[0] if args else typing.Any


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def describe(tp) -> str:
    """What a value of annotation ``tp`` is, in words (``"an integer or None"``)."""
    inner, nullable = _split_optional(tp)
    parts = []
    for t in inner:
        if t in _NAMES:
            parts.append(_NAMES[t])
        elif _is_sequence_type(t):
            parts.append(f"a list of {describe(_element_type(t)).removeprefix('a ').removeprefix('an ')}s")
        elif t is collections.abc.Callable or typing.get_origin(t) is collections.abc.Callable:
            parts.append("a callable")
        elif t is typing.Any:
            parts.append("any value")
        elif t is Mapping or typing.get_origin(t) is collections.abc.Mapping:
            parts.append("a mapping (dict)")
        else:
            name = f"{t.__module__}.{t.__name__}" if t.__module__ == "torch" else getattr(t, "__name__", str(t))
            parts.append(f"{'an' if name[0].lower() in 'aeio' else 'a'} {name}")
    if nullable:
        parts.append("None")
    return " or ".join(parts)


def _is(v, t) -> bool:
    """Whether ``v`` is of type ``t`` (an annotation's member), without any conversion."""
    if t is typing.Any:
        return True
    if t is bool:
        return isinstance(v, bool)
    if t is int:
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)
    if t is float:
        return isinstance(v, numbers.Real) and not isinstance(v, bool)
    if t is str:
        return isinstance(v, str)
    if _is_sequence_type(t):
        return isinstance(v, (list, tuple))
    if t is collections.abc.Callable or typing.get_origin(t) is collections.abc.Callable:
        return callable(v)
    if t is Mapping or typing.get_origin(t) is collections.abc.Mapping:
        return isinstance(v, Mapping)
    return isinstance(v, t) if isinstance(t, type) else False


def _number(x) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _check_range(key, v, meta) -> None:
    gt, ge, le = meta.get("gt"), meta.get("ge"), meta.get("le")
    if gt is not None and not v > gt:
        raise ConfigError(f"{key}: must be > {_number(gt)}, got {v!r}")
    if ge is not None and not v >= ge:
        raise ConfigError(f"{key}: must be >= {_number(ge)}, got {v!r}")
    if le is not None and not v <= le:
        raise ConfigError(f"{key}: must be <= {_number(le)}, got {v!r}")


def _check_scalar(key, v, t, meta):
    """A value already of type ``t``: its range or choices; an integer-like becomes ``int``, a
    number for a float field ``float``."""
    if t is int:
        v = v if type(v) is int else int(v)
        _check_range(key, v, meta)
    elif t is float:
        if not math.isfinite(v):
            raise ConfigError(f"{key}: must be a finite number, got {v!r}")
        v = v if type(v) is float else float(v)
        _check_range(key, v, meta)
    elif t is str:
        choices = meta.get("choices")
        if choices is not None and v not in choices:
            raise ConfigError(f"{key}: unknown value {v!r}; use one of {', '.join(map(str, choices))}")
    return v


def _pick(v, types_, integral_floats: bool):
    """The first of ``types_`` that ``v`` is (an integer is a number too); with
    ``integral_floats`` (a config's values) an integral float is taken for an integer."""
    t = next((t for t in types_ if _is(v, t)), None)
    if (t is None and integral_floats and int in types_ and isinstance(v, float) and math.isfinite(v)
            and v.is_integer()):
        t = int
    return t


def check_value(key: str, v, tp, meta: Mapping | None = None, *, integral_floats: bool = False):
    """``v`` checked against annotation ``tp`` and the rule ``meta``, strictly.

    A value of the wrong type is refused, never converted (``"0.1"`` for a number, ``2.0`` or
    ``True`` for an integer, ``"no"`` for a flag); an integer for a number is stored as a
    ``float``, a tuple for a list-typed field as a list, a NumPy integer as an ``int``. With
    ``integral_floats`` (what a config file or the command line gives: ``max_iter=1e3`` is read
    as a float) an integral float is taken for an integer. Returns the value to store.

    Raises
    ------
    ConfigError
        Naming ``key``: the type expected, or the range or choices broken.
    """
    meta = meta or {}
    inner, nullable = _split_optional(tp)
    if v is None:
        if nullable:
            return None
        raise ConfigError(f"{key}: is required, got None (it must be {describe(tp)})")
    if meta.get("check") is not None:
        return meta["check"](key, v)
    t = _pick(v, inner, integral_floats)
    if t is None:
        raise ConfigError(f"{key}: must be {describe(tp)}, got {v!r} ({type(v).__name__})")
    if _is_sequence_type(t):
        if not v:
            raise ConfigError(f"{key}: the list is empty")
        elem = _element_type(t)
        out = []
        for i, x in enumerate(v):
            et = _pick(x, (elem,), integral_floats)
            if et is None:
                raise ConfigError(f"{key}[{i}]: must be {describe(elem)}, got {x!r} ({type(x).__name__})")
            out.append(_check_scalar(f"{key}[{i}]", x, et, meta))
        return out
    return _check_scalar(key, v, t, meta)


def _dataclass_type(tp):
    """The dataclass of a nested section's annotation (``Spec`` or ``Spec | None``), else None."""
    inner, _ = _split_optional(tp)
    t = inner[0] if len(inner) == 1 else None
    return t if isinstance(t, type) and is_dataclass(t) else None


def check_fields(obj, prefix: str = "") -> None:
    """Check every field of the dataclass instance ``obj`` (:func:`check_value`), in order, and
    store the normalized values (frozen dataclasses too): the ``__post_init__`` of a spec. A
    nested section must be of its dataclass (it checks itself); a field with a ``build`` rule is
    a spec of its own kind, checked when made."""
    hints = _hints(type(obj))
    for f in fields(obj):
        v, tp, key = getattr(obj, f.name), hints[f.name], _key(prefix, f.name)
        sub = _dataclass_type(tp)
        if sub is not None:
            if v is None and _split_optional(tp)[1]:
                continue
            if not isinstance(v, sub):
                raise ConfigError(f"{key}: must be a {sub.__name__}, got {type(v).__name__}")
            continue
        if f.metadata.get("build") is not None:
            continue  # a nested spec of its own kind: built (and checked) by its builder
        new = check_value(key, v, tp, f.metadata)
        if new is not v:
            object.__setattr__(obj, f.name, new)


def check_call(namespace: Mapping, *specs, skip=(), arrays=(), also: Mapping | None = None) -> None:
    """Check an entry point's keywords (``locals()`` at its first line) at its boundary, once,
    without converting or storing them: each that is a field of one of the dataclasses ``specs``
    (the first that has it) against that field's annotation and rule (:func:`check_value`), each
    of ``also`` (``{name: annotation}``, the keywords that are no spec's fields) against its
    annotation.

    Parameters
    ----------
    namespace : mapping
        The call's keywords by name.
    specs : dataclasses (or their instances: a model's defaults)
    skip : iterable of str
        Keywords the function takes in a wider form than its field (an exchange object, one cap
        per agent), checked where they are used.
    arrays : iterable of str
        Keywords that may also be an array (anything with ``shape`` and ``dtype``: one value
        per trial), whose shape and values are checked where they are used.
    also : mapping, optional

    Raises
    ------
    ConfigError
        Naming the keyword (``name`` or ``name[i]``).
    """
    seen = set(skip)
    arrays = set(arrays)
    for name, tp in (also or {}).items():
        check_value(name, namespace[name], tp)
        seen.add(name)
    for spec in specs:
        cls = spec if isinstance(spec, type) else type(spec)
        hints = _hints(cls)
        for f in fields(cls):
            if f.name not in namespace or f.name in seen:
                continue
            seen.add(f.name)
            v = namespace[f.name]
            if f.name in arrays and hasattr(v, "shape") and hasattr(v, "dtype"):
                continue
            check_value(f.name, v, hints[f.name], f.metadata)


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# --------------------------------------------------------------------------------------
# From a config: text formats' values converted, then the dataclass built
# --------------------------------------------------------------------------------------


def coerce(key: str, v, tp, meta: Mapping | None = None):
    """A config value (YAML, JSON, a Hydra override) as annotation ``tp`` says: an integral
    float is an integer, an integer a number, a list stays a list; a mapping where a value
    belongs, a list where one value belongs, or a value of another type is refused."""
    inner, nullable = _split_optional(tp)
    if v is None:
        if nullable:
            return None
        raise ConfigError(f"{key}: is required (got null)")
    if isinstance(v, Mapping) and not any(_is(v, t) for t in inner):
        raise ConfigError(f"{key}: must be a single value, got a mapping")
    if isinstance(v, (list, tuple)) and not any(_is_sequence_type(t) for t in inner):
        raise ConfigError(f"{key}: must be a single value, got a list {list(v)!r}")
    return check_value(key, v, tp, {k: x for k, x in (meta or {}).items() if k != "check"}, integral_floats=True)


def build(cls, data, prefix: str = ""):
    """A ``cls`` from a mapping of config values (or an instance of ``cls``): missing keys take
    the defaults, unknown keys are errors, nested dataclasses are built from their sections
    (``Spec | None`` too), a field with a ``build`` rule by its builder.

    Raises
    ------
    ConfigError
        Naming the dotted key of the first bad value (``prefix`` first).
    """
    if is_dataclass(data) and isinstance(data, cls):
        data = {f.name: getattr(data, f.name) for f in fields(data)}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: must be a mapping of keys to values, got {data!r}")
    names = [f.name for f in fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ConfigError(f"{_key(prefix, str(unknown[0]))}: unknown key; known keys here: {', '.join(names)}")
    hints = _hints(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name not in data or not f.init:
            continue
        key, tp, v = _key(prefix, f.name), hints[f.name], data[f.name]
        sub = _dataclass_type(tp)
        if f.metadata.get("build") is not None:
            kwargs[f.name] = None if v is None else f.metadata["build"](v, key)
        elif sub is not None:
            if v is not None:
                kwargs[f.name] = build(sub, v, key)
            elif _split_optional(tp)[1]:
                kwargs[f.name] = None
        else:
            kwargs[f.name] = coerce(key, v, tp, f.metadata)
    try:
        return cls(**kwargs)
    except PPDNMFError as exc:  # the class's own rules, e.g. across its fields
        raise (exc.within(prefix) if prefix else exc) from None


def check_dataclass(obj, prefix: str = ""):
    """Re-check an already built config (a mutable dataclass of sections), in place: each
    value converted and checked as :func:`build` does; nested (frozen or not) sections
    rebuilt from their values. Returns ``obj``."""
    hints = _hints(type(obj))
    for f in fields(obj):
        key, tp, v = _key(prefix, f.name), hints[f.name], getattr(obj, f.name)
        sub = _dataclass_type(tp)
        if v is None and (f.metadata.get("build") is not None or sub is not None) and _split_optional(tp)[1]:
            continue
        if f.metadata.get("build") is not None:
            new = f.metadata["build"](v, key)
        elif sub is not None:
            if not isinstance(v, sub):
                raise ConfigError(f"{key}: must be a {sub.__name__}, got {type(v).__name__}")
            new = build(sub, v, key) if getattr(sub, "__dataclass_params__").frozen else check_dataclass(v, key)
        else:
            new = coerce(key, v, tp, f.metadata)
        object.__setattr__(obj, f.name, new)
    return obj


def to_plain(obj) -> dict:
    """The plain nested dict of a dataclass (tuples as lists): what YAML and JSON hold."""

    def plain(v):
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(asdict(obj))


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
