"""Step 5 of the X-step behind one small interface, in four kinds.

* ``plain``: float arithmetic (:class:`PlainExchange`).
* ``quantized``: the integer codec, emulated exactly on the device (:class:`QuantizedExchange`).
* ``paillier``: the real protocol on the host with :mod:`phe` (:mod:`.paillier`,
  :class:`~.paillier.PaillierExchange`), imported lazily so that the numerical core never
  imports ``phe``.
* ``secagg``: the pairwise-masked secure sum of the agreed schedule (:mod:`.secagg`,
  :class:`~.secagg.SecAggExchange`; keys and PRG from :mod:`cryptography`), imported lazily too.

Layout: :mod:`.base` (the interface), :mod:`.spec` (one typed spec per kind, its rules, and
:func:`exchange_spec`), :mod:`.factory` (:func:`make_exchange`), :mod:`.codec` (the integer
encoding), :mod:`.integer` (what both integer kinds share), :mod:`.packing` (slots),
:mod:`.costmodel` (operation counts, the ledger, the timing model; it imports no kind).

Costs: every kind has ``costs()`` (a flat dict of numbers), ``pop_iteration_costs()``
(per-ADMM-iteration dicts) and ``bytes_per_edge()``; ``paillier`` measures them,
``quantized`` predicts them with ``cost_model=True`` (:mod:`.costmodel`).
"""
from __future__ import annotations

from .base import Exchange, ExchangeOutput, Topology
from .codec import CodecRangeError, IntegerCodec
from .factory import make_exchange
from .plain import PlainExchange
from .quantized import QuantizedExchange
from .spec import (
    EXCHANGE_KINDS,
    EXCHANGE_OPTIONS,
    PROTOCOLS,
    ExchangeSpec,
    PaillierSpec,
    PlainSpec,
    QuantizedSpec,
    SecAggSpec,
    exchange_spec,
)

__all__ = [
    "Exchange",
    "ExchangeOutput",
    "Topology",
    "IntegerCodec",
    "CodecRangeError",
    "PlainExchange",
    "QuantizedExchange",
    "make_exchange",
    "exchange_spec",
    "ExchangeSpec",
    "PlainSpec",
    "QuantizedSpec",
    "PaillierSpec",
    "SecAggSpec",
    "EXCHANGE_KINDS",
    "PROTOCOLS",
    "EXCHANGE_OPTIONS",
]
