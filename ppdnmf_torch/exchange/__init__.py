"""Step 5 of the X-step behind one small interface, in three kinds.

* ``plain``: float arithmetic (:class:`PlainExchange`).
* ``quantized``: the integer codec, emulated exactly on the device (:class:`QuantizedExchange`).
* ``paillier``: the real protocol on the host with :mod:`phe` (:class:`~.paillier.PaillierExchange`),
  imported lazily so that the numerical core never imports ``phe``.

Costs: every kind has ``costs()`` (a flat dict of numbers), ``pop_iteration_costs()``
(per-ADMM-iteration dicts) and ``bytes_per_edge()``; ``paillier`` measures them,
``quantized`` predicts them with ``cost_model=True`` (:mod:`.costmodel`).
"""
from __future__ import annotations

from .._utils import ConfigError
from .base import Exchange, ExchangeOutput, Topology
from .codec import CodecRangeError, IntegerCodec
from .plain import PlainExchange
from .quantized import QuantizedExchange

__all__ = [
    "Exchange",
    "ExchangeOutput",
    "Topology",
    "IntegerCodec",
    "CodecRangeError",
    "PlainExchange",
    "QuantizedExchange",
    "make_exchange",
    "EXCHANGE_KINDS",
    "PROTOCOLS",
    "EXCHANGE_OPTIONS",
]

EXCHANGE_KINDS = ("plain", "quantized", "paillier")
PROTOCOLS = ("aggregated", "paper")


#: options each kind accepts through ``make_exchange(**options)`` / ``fit(exchange_options=...)``;
#: ``packing`` / ``slot_bits`` (quantized: counts of the packed protocol) and the fast host
#: path's ``fast``, ``packing``, ``slot_bits``, ``precompute``, ``djn``, ``djn_exponent_bits``,
#: ``workers`` (paillier) are documented on :class:`~.paillier.PaillierExchange`
EXCHANGE_OPTIONS = {
    "plain": ("cost_model",),  # accepted and ignored: no integer protocol to cost
    "quantized": ("cost_model", "packing", "slot_bits"),
    "paillier": ("cost_model", "keypairs", "record_transcript", "fast", "packing", "slot_bits", "precompute",
                 "djn", "djn_exponent_bits", "workers"),
}


def make_exchange(kind="plain", *, protocol="aggregated", n_max=1e6, key_bits=2048, g_bits=16, **options) -> Exchange:
    """Build an exchange by name.

    Parameters
    ----------
    kind : {"plain", "quantized", "paillier"}
    protocol : {"aggregated", "paper"}
        Message pattern of the Paillier stage (see ALGORITHM.md); the numbers are the same.
        ``quantized`` counts the cost of this pattern when its cost model is on.
    n_max : float
        Quantization scale of the values (the paper's ``N_max``).
    key_bits : int
        Paillier modulus size; sets the codec's range for ``quantized`` too.
    g_bits : int
        Penalties are scaled by ``2^g_bits`` before they become exponents.
    **options
        ``cost_model`` (``quantized``, ``paillier``; bool or
        :class:`~ppdnmf_torch.exchange.costmodel.PaillierOpCosts`): count the Paillier
        operations and estimate their time (see :mod:`~ppdnmf_torch.exchange.costmodel`);
        ``keypairs`` (``paillier``): pre-made key pairs, one per node (tests, benchmarks).
    """
    if isinstance(kind, Exchange):
        return kind
    if kind not in EXCHANGE_KINDS:
        raise ConfigError(f"exchange: unknown kind {kind!r}; use one of {EXCHANGE_KINDS}")
    if protocol not in PROTOCOLS:
        raise ConfigError(f"protocol: unknown protocol {protocol!r}; use one of {PROTOCOLS}")
    unknown = sorted(set(options) - set(EXCHANGE_OPTIONS[kind]))
    if unknown:
        raise ConfigError(
            f"exchange_options: {unknown} do not apply to exchange={kind!r}; "
            f"it accepts {list(EXCHANGE_OPTIONS[kind])}"
        )
    if kind == "plain":
        return PlainExchange()
    codec = IntegerCodec(n_max=n_max, g_bits=g_bits, key_bits=key_bits)
    if kind == "quantized":
        return QuantizedExchange(codec, protocol=protocol, **options)
    from .paillier import PaillierExchange

    return PaillierExchange(codec, protocol=protocol, **options)
