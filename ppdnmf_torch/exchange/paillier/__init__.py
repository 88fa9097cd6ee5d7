"""``exchange="paillier"``: the real Paillier protocol on the host, with :mod:`phe`.

* :mod:`.exchange`: :class:`PaillierExchange`, the facade the solver calls (lifecycle,
  step 1 and step 5, costs).
* :mod:`.rounds`: the protocol rounds, a naive and a fast implementation of one interface.
* :mod:`.keys`: the raw primitives, the messages and the agents that hold the private keys.
* :mod:`.network`: the agents' links, the wire messages and the transfers.
* :mod:`.obfuscation`, :mod:`.pool`: the fast path's obfuscators and worker processes.
* :mod:`.calibration`: per-operation costs on this machine, for the timing model.

Importing this package imports :mod:`phe`; the numerical core and the other exchange kinds
never do (``exchange="quantized"`` imports :mod:`.calibration` when it first estimates a time).
"""
from __future__ import annotations

from ..spec import MIN_KEY_BITS, SECURE_KEY_BITS
from .calibration import calibrate
from .exchange import PaillierExchange
from .keys import EncryptedVector, InsecureKeyWarning, KeyMismatchError, RawPaillier, generate_keypairs
from .network import WireMessage

__all__ = [
    "PaillierExchange",
    "generate_keypairs",
    "InsecureKeyWarning",
    "KeyMismatchError",
    "EncryptedVector",
    "RawPaillier",
    "WireMessage",
    "calibrate",
    "SECURE_KEY_BITS",
    "MIN_KEY_BITS",
]
