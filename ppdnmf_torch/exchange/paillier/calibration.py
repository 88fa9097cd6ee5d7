"""Per-operation costs of the real Paillier stage on this machine, for the timing model.

:func:`calibrate` measures a :class:`~ppdnmf_torch.exchange.costmodel.PaillierOpCosts`
in two steps:

1. the raw operations through the layer the naive stage uses (:class:`~.keys.RawPaillier`):
   key generation, encryption, decryption, homomorphic addition, scalar multiplication, each
   timed in batches of at least :data:`BATCH_SECONDS` or :data:`BATCH_CALLS` calls (a shared
   machine's CPU share is in the figure, as it is in a run's) and the median taken over five
   batches: a bounded amount of work, whatever the machine;
2. the run's own path (:func:`~.exchange.time_path`, through :func:`~.exchange.calibrate_for`):
   a :class:`~.exchange.PaillierExchange` with the run's protocol, packing and fast switches,
   bound to a triangle of three agents with the keys of step 1, times ADMM iterations (at least
   :data:`PATH_ROUNDS` and :data:`PATH_SECONDS`) of messages of :data:`PATH_VALUES` values
   (:data:`PATH_VALUES_UNPACKED` without packing); the seconds they take over what step 1's
   costs price their counted operations at is the path's factor, and every operation's cost is
   scaled by it. It carries what the counts leave out (the masked
   protocol's mask streams, packing, the workers' traffic) and what the fast paths save.

:func:`~ppdnmf_torch.exchange.costmodel.run_seconds` turns a run's counts into seconds with the
result: one computation, one calibration, whichever command asks; the calibration is kept per
machine in a small JSON file (:mod:`~.calibration_cache`), so that another process, another
command, gets the same figure for the same run. ``exchange="quantized"``
imports this module only when it is first asked for an estimate.
"""
from __future__ import annotations

import dataclasses
import random
import statistics
import time

from ..costmodel import PaillierOpCosts
from . import calibration_cache as _disk
from . import keys as _keys
from .keys import RawPaillier

__all__ = ["calibrate", "path_settings", "KEYGENS", "BATCH_SECONDS", "BATCH_CALLS", "PATH_ROUNDS", "PATH_SECONDS",
           "PATH_MAX_ROUNDS", "PATH_VALUES", "PATH_VALUES_UNPACKED"]

_CACHE: dict = {}
#: key pairs :func:`calibrate` generates (the triangle's three; ``keygen`` is their mean)
KEYGENS = 3
#: the least wall time of one timed batch of an operation, and the most calls a batch makes
BATCH_SECONDS = 0.02
BATCH_CALLS = 64
#: ADMM iterations of the path timed after a first one (the workers' start, the first obfuscators):
#: at least PATH_ROUNDS, more until they have taken PATH_SECONDS (a short key's rounds are short, and
#: a busy machine's pauses would weigh on one or two), at most PATH_MAX_ROUNDS
PATH_ROUNDS = 2
PATH_SECONDS = 0.5
PATH_MAX_ROUNDS = 20
#: values per message of the path (the paper-synthetic run's ``L K``), and without packing
#: (every operation of an unpacked round is per value: fewer suffice)
PATH_VALUES = 150
PATH_VALUES_UNPACKED = 16


def _per_call(fn, batches: int = 5) -> float:
    """Seconds per ``fn()`` call: the median over ``batches`` batches of calls, each at least
    :data:`BATCH_SECONDS` long or :data:`BATCH_CALLS` calls (a batch's mean carries the CPU share
    a busy machine leaves; the median drops the batch a long pause lands on)."""
    t0 = time.perf_counter()
    fn()
    first = max(time.perf_counter() - t0, 1e-7)
    per = min(BATCH_CALLS, max(1, int(BATCH_SECONDS / first)))
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        out.append((time.perf_counter() - t0) / per)
    return statistics.median(out)


def _raw_costs(keys, key_bits: int, exponent_bits: int, repeats: int, keygen: float) -> PaillierOpCosts:
    pub, priv = keys[0]
    raw = RawPaillier(None)
    rng = random.Random(12345)  # plaintexts only; the obfuscators come from phe's SystemRandom
    plain = [rng.randrange(-(1 << 40), 1 << 40) % pub.n for _ in range(repeats)]
    cts = raw.encrypt(pub, plain)
    if raw.decrypt(priv, cts) != plain:  # pragma: no cover - a broken phe/gmpy2 install
        raise RuntimeError("Paillier calibration: decryption does not invert encryption")
    exponent = rng.getrandbits(exponent_bits) | (1 << (exponent_bits - 1))
    n = len(plain)
    t_enc = _per_call(lambda: raw.encrypt(pub, plain)) / n
    t_dec = _per_call(lambda: raw.decrypt(priv, cts)) / n
    t_add = _per_call(lambda: raw.add(pub, cts, cts)) / n
    t_mul = _per_call(lambda: raw.scalar_mul(pub, cts, exponent)) / n
    return PaillierOpCosts(key_bits, keygen, t_enc, t_dec, t_add, t_mul, exponent_bits, repeats)


def calibrate(key_bits: int = 2048, repeats: int = 12, *, exponent_bits: int = 32, refresh: bool = False,
              path: dict | None = None, time_path=None) -> PaillierOpCosts:
    """Seconds per Paillier operation at ``key_bits`` on this machine (cached per settings).

    Parameters
    ----------
    key_bits : int
    repeats : int
        Values per timed call of each raw operation.
    exponent_bits : int
        Bits of the scalar multiplications' exponent.
    refresh : bool
        Measure again instead of the caches (in the process, and on disk:
        :mod:`~.calibration_cache`; ``$PPDNMF_RECALIBRATE=1`` does the same once per process),
        and store the new figures.
    path : dict, optional
        The :class:`~.exchange.PaillierExchange` settings whose rounds scale the raw costs
        (``protocol``, ``n_max``, ``g_bits``, ``fast``, ``packing``, ``slot_bits``,
        ``precompute``, ``djn``, ``djn_exponent_bits``, ``workers``); None: the raw costs
        alone (``path_factor`` 1).
    time_path : callable, optional
        ``time_path(keys, raw_costs, path) -> factor`` with ``path``: the seconds of the path's
        rounds over what the raw costs price their counted operations at
        (:func:`~.exchange.time_path`; the keys move into its agents).

    Returns
    -------
    PaillierOpCosts
        With ``path_factor`` the scale applied (key generation is never scaled): read from the
        machine's cache file when it holds these settings (:mod:`~.calibration_cache`, so that
        every process prices the same run alike), else timed here and written there.
    """
    key_bits, repeats, exponent_bits = int(key_bits), max(1, int(repeats)), int(exponent_bits)
    if path is not None and time_path is None:
        raise ValueError("calibrate: path needs its time_path (exchange.calibrate_for passes both)")
    cache_key = (key_bits, repeats, exponent_bits, tuple(sorted((path or {}).items())))
    if not refresh and cache_key in _CACHE:
        return _CACHE[cache_key]
    disk_key = _disk.entry_key(key_bits, repeats, exponent_bits, path)
    stored = None if refresh or _disk.recalibrate_requested() else _disk.load(disk_key)
    if stored is not None:
        _CACHE[cache_key] = stored
        return stored
    t0 = time.perf_counter()
    # interruptible; refuses sizes above the limit (looked up on its module: the key-hygiene test sees them)
    keys = [_keys.generate_keypair(key_bits) for _ in range(KEYGENS)]
    keygen = (time.perf_counter() - t0) / KEYGENS
    base = _raw_costs(keys, key_bits, exponent_bits, repeats, keygen)
    if path is not None:
        f = time_path(keys, base, dict(path))  # the keys move into the triangle's agents, closed there
        base = dataclasses.replace(base, encryption=base.encryption * f, decryption=base.decryption * f,
                                   homomorphic_addition=base.homomorphic_addition * f,
                                   scalar_multiplication=base.scalar_multiplication * f, path_factor=f)
    del keys
    _CACHE[cache_key] = base
    _disk.store(disk_key, base)
    return base


#: the settings of the path a calibration times, with the defaults of ``exchange="paillier"``
#: (a ``quantized`` run stands in for a ``paillier`` run with the defaults it does not name)
_PATH_DEFAULTS = {"protocol": "masked", "n_max": 1e6, "g_bits": 16, "fast": True, "packing": True, "slot_bits": None,
                  "precompute": True, "djn": False, "djn_exponent_bits": None, "workers": None}


def path_settings(spec) -> dict:
    """The path settings of ``spec`` (a ``PaillierSpec``, or a ``QuantizedSpec``: its protocol,
    codec and packing, with ``paillier``'s defaults for the fast switches it has not got), every
    key of the defaults filled in: the same run asked by two commands gets the same dict, so the
    same cached calibration and the same figure."""
    out = dict(_PATH_DEFAULTS)
    out.update({k: getattr(spec, k) for k in _PATH_DEFAULTS if hasattr(spec, k)})
    out["n_max"], out["g_bits"] = float(out["n_max"]), int(out["g_bits"])
    return out


