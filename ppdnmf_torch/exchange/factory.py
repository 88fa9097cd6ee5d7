"""The one factory of exchanges: :func:`make_exchange`, from a kind name or a spec."""
from __future__ import annotations

import functools

from ..errors import ConfigError
from .base import Exchange
from .plain import PlainExchange
from .quantized import QuantizedExchange
from .spec import FLAT_KEYS, exchange_spec

__all__ = ["make_exchange", "exchange_class"]

def exchange_class(kind: str) -> type:
    """The exchange class of ``kind`` (``paillier`` imports :mod:`phe`, ``secagg`` :mod:`cryptography`,
    here and only here)."""
    if kind == "plain":
        return PlainExchange
    if kind == "quantized":
        return QuantizedExchange
    if kind == "paillier":
        from .paillier import PaillierExchange

        return PaillierExchange
    if kind == "secagg":
        from .secagg import SecAggExchange  # imports cryptography: here and only here

        return SecAggExchange
    raise ConfigError(f"exchange: unknown kind {kind!r}")


@functools.lru_cache(maxsize=None)
def _with_mixin(mixin: type, cls: type) -> type:
    return type(f"{mixin.__name__}{cls.__name__}", (mixin, cls), {})


def make_exchange(kind_or_spec="plain", *, mixin=None, **kw) -> Exchange:
    """Build an exchange from a kind name and its settings, or from a spec.

    Parameters
    ----------
    kind_or_spec : str, ExchangeSpec or Exchange
        ``"plain"``, ``"quantized"``, ``"paillier"`` or ``"secagg"``, or a spec
        (:class:`~.spec.PlainSpec`, :class:`~.spec.QuantizedSpec`, :class:`~.spec.PaillierSpec`,
        :class:`~.spec.SecAggSpec`).
        An :class:`~.base.Exchange` is returned as it is (its settings must agree with ``kw``).
    mixin : type, optional
        A class put before the kind's class: the exchange is an instance of
        ``type(name, (mixin, cls), {})`` (for example a recorder that wraps ``exchange``
        and calls ``super()``); the same pair always gives the same class.
    **kw
        The settings of the kind (:func:`~.spec.exchange_spec`): ``protocol``, ``n_max``,
        ``key_bits``, ``g_bits`` and the kind's options (:data:`~.spec.EXCHANGE_OPTIONS`),
        e.g. ``cost_model`` (``quantized``, ``paillier``; bool or
        :class:`~ppdnmf_torch.exchange.costmodel.PaillierOpCosts`: count the Paillier
        operations and estimate their time) or ``keypairs`` (``paillier``: pre-made key
        pairs, one per node; tests, benchmarks).

    Raises
    ------
    ConfigError
        As :func:`~.spec.exchange_spec`: naming a setting the kind does not take, one that
        contradicts a given spec or exchange, or one its rules refuse.
    """
    flat = {k: kw.pop(k) for k in FLAT_KEYS if k in kw}
    spec = exchange_spec(kind_or_spec, options=kw, **flat)
    if isinstance(spec, Exchange):
        if mixin is not None:
            raise ConfigError("mixin: applies to an exchange made here, not to a given Exchange")
        return spec
    cls = exchange_class(spec.kind)
    if mixin is not None:
        cls = _with_mixin(mixin, cls)
    args, kwargs = spec.arguments()
    return cls(*args, **kwargs)
