"""Objects that hold key material: private keys and mask seeds never leave them.

:class:`HoldsPrivateKey` refuses pickling and copying, so such an object can never leave its
owner through a checkpoint, a worker pool or a deep copy; :class:`SeedBox` is one party's seeds,
by tag, with no method that returns one (the masked protocol's :class:`~.paillier.seeds.SeedStore`
and the secure aggregation's seed vaults, :mod:`.aggregation`). This module imports no
cryptography library, so the emulated kinds use it without :mod:`phe`.
"""
from __future__ import annotations

__all__ = ["HoldsPrivateKey", "SeedBox", "SEED_BYTES"]

#: bytes of every mask seed (256 bits, :data:`~.costmodel.SEED_BITS`)
SEED_BYTES = 32


def _refuse(obj):
    raise TypeError(f"{type(obj).__name__} holds Paillier private-key material (or mask seeds) and cannot be "
                    "pickled, copied or serialized; checkpoint the solver state instead and regenerate keys on "
                    "resume")


class HoldsPrivateKey:
    """Mixin for objects that hold private-key material (a Paillier key, the masked protocol's
    seeds): pickling and copying are refused, so it can never leave its object through a
    checkpoint, a worker pool or a deep copy."""

    __slots__ = ()

    def __reduce_ex__(self, protocol):
        _refuse(self)

    def __reduce__(self):
        _refuse(self)

    def __getstate__(self):
        _refuse(self)

    def __copy__(self):
        _refuse(self)

    def __deepcopy__(self, memo):
        _refuse(self)


class SeedBox(HoldsPrivateKey):
    """One party's seeds by tag; subclasses add the one thing their protocol derives from them.
    Its repr shows a count."""

    __slots__ = ("_seeds",)

    def __init__(self):
        self._seeds = {}

    def put(self, tag, seed: bytes) -> None:
        if len(seed) != SEED_BYTES:
            raise ValueError(f"{type(self).__name__}: a seed has {SEED_BYTES} bytes")
        self._seeds[tag] = bytes(seed)

    def __contains__(self, tag) -> bool:
        return tag in self._seeds

    def __len__(self) -> int:
        return len(self._seeds)

    def clear(self) -> None:
        self._seeds.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._seeds)} seeds)"
