"""The typed description of an exchange: one frozen spec per kind, its rules, and the
resolution of what a caller passed into one spec.

A spec holds the settings of one exchange kind and checks them when it is made (the one
place where each rule is written; :class:`~.codec.IntegerCodec` calls the codec's rules
too). :func:`exchange_spec` turns what a caller passes (a kind name with flat values and
options, a spec, or an :class:`~.base.Exchange`) into one spec, and refuses any value
that does not apply or contradicts it; :func:`~.factory.make_exchange` builds the exchange.

This module imports no exchange kind and no :mod:`phe`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import ConfigError
from .base import Exchange
from .codec import IntegerCodec, check_codec_params
from .costmodel import PaillierOpCosts
from .packing import derive_layout

__all__ = [
    "EXCHANGE_KINDS",
    "PROTOCOLS",
    "FLAT_KEYS",
    "SECURE_KEY_BITS",
    "MIN_KEY_BITS",
    "EXCHANGE_OPTIONS",
    "ExchangeSpec",
    "PlainSpec",
    "IntegerSpec",
    "QuantizedSpec",
    "PaillierSpec",
    "SecAggSpec",
    "SPECS",
    "exchange_spec",
]

#: the exchange kinds, by the name configs and :func:`~.factory.make_exchange` use
EXCHANGE_KINDS = ("plain", "quantized", "paillier", "secagg")
#: the message patterns of the integer protocol (docs/SECURE_EXCHANGE.md); the numbers are the same.
#: ``masked`` hides every neighbour's term from the receiver; ``aggregated`` and ``paper`` are the
#: printed protocols, kept for comparison
PROTOCOLS = ("masked", "aggregated", "paper")
#: Paillier key sizes below this warn (``paillier.InsecureKeyWarning``)
SECURE_KEY_BITS = 2048
#: the smallest Paillier key size accepted (the codec needs room for its limit)
MIN_KEY_BITS = 64
#: the settings ``fit`` and :func:`exchange_spec` take as keywords of their own (the shorthand)
FLAT_KEYS = ("protocol", "n_max", "key_bits", "g_bits")


# --------------------------------------------------------------------------- the rules
def check_protocol(protocol) -> None:
    if protocol not in PROTOCOLS:
        raise ConfigError(f"protocol: unknown protocol {protocol!r}; use one of {PROTOCOLS}")


def check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: expected True or False, got {value!r}")


def check_cost_model(cost_model) -> None:
    if not isinstance(cost_model, (bool, PaillierOpCosts)):
        raise ConfigError(f"cost_model: expected True, False or PaillierOpCosts, got {cost_model!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------- the specs
@dataclass(frozen=True)
class ExchangeSpec:
    """Base of the specs; ``kind`` names the exchange kind a spec describes."""

    kind: ClassVar[str] = ""

    @classmethod
    def keys(cls) -> tuple:
        """The settings of this kind, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def arguments(self) -> tuple:
        """``(args, kwargs)`` of the kind's constructor for these settings."""
        return (), {}


@dataclass(frozen=True)
class PlainSpec(ExchangeSpec):
    """``exchange="plain"``: float arithmetic; it has no settings."""

    kind: ClassVar[str] = "plain"


@dataclass(frozen=True)
class IntegerSpec(ExchangeSpec):
    """What both integer kinds take: the protocol whose messages they send or count, the
    codec (:class:`~.codec.IntegerCodec`: ``n_max``, ``key_bits``, ``g_bits``) and the cost
    model (``cost_model``: True, False or a :class:`~.costmodel.PaillierOpCosts`)."""

    protocol: str = "masked"
    n_max: float = 1e6
    key_bits: int = 2048
    g_bits: int = 16
    cost_model: bool | PaillierOpCosts = False

    def __post_init__(self):
        check_protocol(self.protocol)
        check_codec_params(self.n_max, self.g_bits, self.key_bits)
        check_cost_model(self.cost_model)

    def codec(self) -> IntegerCodec:
        return IntegerCodec(n_max=self.n_max, g_bits=self.g_bits, key_bits=self.key_bits)

    def arguments(self) -> tuple:
        codec_keys = ("n_max", "key_bits", "g_bits")
        return (self.codec(),), {k: getattr(self, k) for k in self.keys() if k not in codec_keys}


@dataclass(frozen=True)
class QuantizedSpec(IntegerSpec):
    """``exchange="quantized"`` (:class:`~.quantized.QuantizedExchange`): ``packing`` and
    ``slot_bits`` choose which protocol's counts the cost model predicts."""

    kind: ClassVar[str] = "quantized"
    packing: bool = False
    slot_bits: int | None = None

    def __post_init__(self):
        super().__post_init__()
        check_flag("packing", self.packing)
        if self.slot_bits is not None:
            derive_layout(self.codec(), packing=self.packing, slot_bits=self.slot_bits)  # its rule


@dataclass(frozen=True)
class PaillierSpec(IntegerSpec):
    """``exchange="paillier"`` (:class:`~.paillier.PaillierExchange`, which documents every
    setting). ``keypairs`` (pre-made keys, tests) and ``pool_audit`` (a test hook) are left
    out of the repr and of comparisons; an exchange never keeps ``keypairs`` in its spec."""

    kind: ClassVar[str] = "paillier"
    fast: bool = True
    packing: bool = True
    slot_bits: int | None = None
    precompute: bool = True
    djn: bool = False
    djn_exponent_bits: int | None = None
    workers: int | None = None
    record_transcript: bool = False
    keypairs: object = field(default=None, repr=False, compare=False)
    pool_audit: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        for name in ("fast", "packing", "precompute", "djn"):
            check_flag(name, getattr(self, name))
        w = self.workers
        if w is not None and (not _is_int(w) or w < 0):
            raise ConfigError(f"workers: expected None or an integer >= 0, got {w!r}")
        b = self.djn_exponent_bits
        if b is not None and (not _is_int(b) or b < 16):
            raise ConfigError(f"djn_exponent_bits: expected None or an integer >= 16, got {b!r}")
        super().__post_init__()
        kb = self.key_bits
        if kb < MIN_KEY_BITS or kb % 2:
            raise ConfigError(f"key_bits: Paillier keys need an even size >= {MIN_KEY_BITS} bits, got {kb}")
        if self.fast and self.slot_bits is not None:  # the naive path has no slots to narrow
            derive_layout(self.codec(), packing=self.packing, slot_bits=self.slot_bits)


@dataclass(frozen=True)
class SecAggSpec(ExchangeSpec):
    """``exchange="secagg"`` (:class:`~.secagg.SecAggExchange`): the pairwise-masked secure sum
    of the agreed schedule. The codec's ``n_max`` and ``g_bits`` as ``quantized`` takes them; its
    range is the int64 emulation's (``2^62``, the range of ``quantized`` at its default 2048-bit
    ``key_bits``), so it has no ``key_bits`` and no ``protocol``. ``record_transcript`` (the audit)
    is left out of the config."""

    kind: ClassVar[str] = "secagg"
    n_max: float = 1e6
    g_bits: int = 16
    record_transcript: bool = False

    def __post_init__(self):
        check_codec_params(self.n_max, self.g_bits, SECURE_KEY_BITS)
        check_flag("record_transcript", self.record_transcript)

    def codec(self) -> IntegerCodec:
        return IntegerCodec(n_max=self.n_max, g_bits=self.g_bits, key_bits=SECURE_KEY_BITS)

    def arguments(self) -> tuple:
        return (self.codec(),), {"record_transcript": self.record_transcript}


#: the spec of every kind, by name
SPECS = {cls.kind: cls for cls in (PlainSpec, QuantizedSpec, PaillierSpec, SecAggSpec)}

#: the options of each kind beyond the flat shorthand (:data:`FLAT_KEYS`), as
#: ``make_exchange(kind, **options)`` and ``fit(exchange_options=...)`` take them
EXCHANGE_OPTIONS = {kind: tuple(k for k in cls.keys() if k not in FLAT_KEYS) for kind, cls in SPECS.items()}


# ---------------------------------------------------------------------- the resolution
def exchange_spec(exchange="plain", *, protocol=None, n_max=None, key_bits=None, g_bits=None, options=None):
    """One exchange spec (or the given :class:`~.base.Exchange`) from what a caller passed.

    Parameters
    ----------
    exchange : str, ExchangeSpec or Exchange
        A kind name (:data:`EXCHANGE_KINDS`): its spec is built from the flat values that
        are not None and ``options``. A spec, or an exchange (through its
        :attr:`~.base.Exchange.spec`): the flat values and options must agree with it.
    protocol, n_max, key_bits, g_bits : optional
        The flat shorthand (None: not given).
    options : dict, optional
        Further settings of the kind (:data:`EXCHANGE_OPTIONS`).

    Returns
    -------
    ExchangeSpec or Exchange
        ``exchange`` itself when it is a spec or an exchange.

    Raises
    ------
    ConfigError
        Naming the setting: one the kind does not take (and the kind), one that differs
        from the given spec's or exchange's, one given both flat and in ``options`` with
        two values, or any value a spec's rules refuse. Nothing is ever dropped.
    """
    values = _given(dict(protocol=protocol, n_max=n_max, key_bits=key_bits, g_bits=g_bits), options)
    if isinstance(exchange, Exchange):
        spec = exchange.spec
        if spec is None:
            if values:
                key = next(iter(values))
                raise ConfigError(f"{key}: the exchange {type(exchange).__name__} has no spec to apply it to; "
                                  "set it on the exchange itself")
            return exchange
        _check_agrees(spec, values, "the given exchange")
        return exchange
    if isinstance(exchange, ExchangeSpec):
        _check_agrees(exchange, values, "the given spec")
        return exchange
    if not isinstance(exchange, str) or exchange not in SPECS:
        raise ConfigError(f"exchange: unknown kind {exchange!r}; use one of {EXCHANGE_KINDS}, "
                          "an exchange spec or an Exchange")
    cls = SPECS[exchange]
    _check_applies(cls, values)
    return cls(**values)


def _given(flat: dict, options) -> dict:
    """The flat values that are not None, then the options; a key given twice must agree."""
    if options is None:
        options = {}
    elif not isinstance(options, dict):
        raise ConfigError(f"options: expected a dict of exchange settings, got {options!r}")
    values = {k: v for k, v in flat.items() if v is not None}
    for k, v in options.items():
        if k in values and values[k] != v:
            raise ConfigError(f"{k}: given twice, {values[k]!r} and {v!r} (in the options)")
        values[k] = v
    return values


def _check_applies(cls, values: dict) -> None:
    keys = cls.keys()
    for k in values:
        if k not in keys:
            takes = ", ".join(keys) if keys else "no settings"
            raise ConfigError(f"{k}: does not apply to exchange={cls.kind!r} (it takes {takes})")


def _check_agrees(spec: ExchangeSpec, values: dict, what: str) -> None:
    _check_applies(type(spec), values)
    for k, v in values.items():
        have = getattr(spec, k)
        if have is not v and have != v:
            raise ConfigError(f"{k}: {v!r} contradicts {what}'s {k}={have!r}; pass one or the other")
