"""The fast Paillier host path: packing, precomputed / CRT / DJN obfuscators, the worker pool.

Every fast path, alone and combined, must give the same bits as ``exchange="quantized"``
(and so as the naive per-value path), count what it does as the cost model predicts, and
never let private key material out of its agent.
"""
from __future__ import annotations

import copy
import itertools
import pickle
import pickletools
import time

import gmpy2
import pytest
import torch

from ppdnmf_torch import fit
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.exchange import EXCHANGE_OPTIONS, CodecRangeError, IntegerCodec, QuantizedExchange, make_exchange
from ppdnmf_torch.exchange.base import Topology
from ppdnmf_torch.exchange.costmodel import COUNT_KEYS
from ppdnmf_torch.exchange.paillier.obfuscation import (
    FixedBaseTable,
    PrivateCRT,
    default_djn_exponent_bits,
    djn_base,
    djn_obfuscators,
    random_obfuscators,
    security_bits,
)
from ppdnmf_torch.exchange.packing import SlotDecodeError, derive_layout
from ppdnmf_torch.exchange.paillier import PaillierExchange
from ppdnmf_torch.exchange.paillier.pool import ObfuscatorSupply, ThreadLanes, WorkerPool, resolve_workers

from conftest import CYCLE4, PATH3, PATH4, PROTOCOLS, drive, penalty_encodings

pytestmark = [
    pytest.mark.crypto,
    pytest.mark.filterwarnings("ignore::ppdnmf_torch.exchange.paillier.InsecureKeyWarning"),
]

CPU = torch.device("cpu")
LK = 11  # not a multiple of the slot count: the last plaintext has unused slots


def bound(ex, topo):
    ex.bind(topo, dtype=torch.float64, device=CPU)
    return ex


def assert_same(outs_a, outs_b):
    for a, b in zip(outs_a, outs_b, strict=True):
        for x, y in zip(a, b):
            if x is None or y is None:
                assert x is None and y is None
            else:
                assert x.dtype == y.dtype and torch.equal(x, y)


# (packing, precompute, djn) in every combination, in-process; the pool on a few of them
COMBOS = [dict(packing=pk, precompute=pc, djn=dj, workers=0)
          for pk, pc, dj in itertools.product([False, True], repeat=3)]
POOL_COMBOS = [dict(packing=True, precompute=True, djn=False, workers=2),
               dict(packing=True, precompute=True, djn=True, workers=2),
               dict(packing=False, precompute=False, djn=False, workers=2)]


def _cid(c):
    return "-".join(k if v is True else f"{k}{v}" for k, v in c.items() if v not in (False, 0)) or "raw"


# ------------------------------------------------------------------- bit identity
@pytest.mark.parametrize("key_bits", [128, 512])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_fast_path_is_bit_identical_to_quantized(protocol, key_bits, paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4, PATH4])  # two trials, different graphs
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=key_bits)
    keys = paillier_keypairs(key_bits, topo.n_nodes)
    q = bound(QuantizedExchange(codec, protocol=protocol), topo)
    fast = [bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, **c), topo) for c in COMBOS]
    outs = drive([q] + fast, topo, lk=LK, n_iter=3, seed=key_bits + len(protocol), skip_step1=(1,))
    for out in outs[1:]:
        assert_same(outs[0], out)
    for ex in fast:
        ex.close()


@pytest.mark.parametrize("combo", POOL_COMBOS, ids=_cid)
@pytest.mark.parametrize("key_bits", [128, 512])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pool_paths_are_bit_identical(protocol, key_bits, combo, paillier_keypairs, monkeypatch):
    from ppdnmf_torch.exchange.paillier import rounds

    monkeypatch.setattr(rounds, "LANE_MIN_KEY_BITS", 64)  # the thread lanes at test key sizes
    topo = Topology.from_graphs([CYCLE4, PATH4])
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=key_bits)
    keys = paillier_keypairs(key_bits, topo.n_nodes)
    q = bound(QuantizedExchange(codec, protocol=protocol), topo)
    p = bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, **combo), topo)
    assert p.workers == 2 and p.rounds.pool is not None
    outs = drive([q, p], topo, lk=LK, n_iter=3, seed=3, skip_step1=(1,))
    assert_same(outs[0], outs[1])
    assert p.rounds.lanes.helper_chunks > 0  # the per-edge work ran on both lanes
    p.close()
    assert p.rounds.pool is None and p.rounds.lanes is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_workers_2_same_bits_as_workers_1(protocol, paillier_keypairs, monkeypatch):
    """Pool and thread lanes change where the work runs, nothing else: the same numbers,
    the same counts, and the same messages in the same order."""
    from ppdnmf_torch.exchange.paillier import rounds

    topo = Topology.from_graphs([CYCLE4])
    codec = IntegerCodec(n_max=1e5, g_bits=12, key_bits=512)
    keys = paillier_keypairs(512, 4)
    below = bound(PaillierExchange(codec, keypairs=keys, workers=2), topo)
    assert below.rounds.pool is not None and below.rounds.lanes is None  # no lanes below 2048-bit keys
    below.close()
    monkeypatch.setattr(rounds, "LANE_MIN_KEY_BITS", 512)
    one = bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, workers=1, record_transcript=True), topo)
    two = bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, workers=2, record_transcript=True), topo)
    assert one.rounds.pool is None and one.rounds.lanes is None
    assert two.rounds.pool is not None and two.rounds.lanes.threads == 2
    a, b = drive([one, two], topo, lk=20, n_iter=3, seed=9, skip_step1=(1,))
    assert_same(a, b)
    assert two.rounds.lanes.helper_chunks > 0
    c1, c2 = one.costs(), two.costs()
    assert c1["encryptions"] > 0 and all(c1[k] == c2[k] for k in COUNT_KEYS)

    def wire(ex):  # ciphertexts are random; who sent what kind of message, and how long, is not
        return [(m.bcd_iter, m.admm_iter, m.sender, m.receiver, m.kind, len(m.payload)) for m in ex.transcript]

    assert wire(one) == wire(two) and len(wire(one)) > 0
    two.close()


class _SeededSecrets:
    """Stands in for :mod:`secrets` in :mod:`~ppdnmf_torch.exchange.paillier.obfuscation`: reproducible obfuscators."""

    def __init__(self, seed):
        import random

        self._r = random.Random(seed)

    def randbelow(self, n):
        return self._r.randrange(n)

    def randbits(self, k):
        return self._r.getrandbits(k)

    def token_bytes(self, k):
        return self._r.randbytes(k)


@pytest.mark.parametrize("djn", [False, True])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_thread_lanes_send_the_same_messages_as_one_thread(protocol, djn, paillier_keypairs, monkeypatch):
    """With reproducible obfuscators, lanes and a serial loop put the same ciphertexts on the
    wire in the same order, and count the same operations in every iteration."""
    from ppdnmf_torch.exchange.paillier import obfuscation, seeds

    topo = Topology.from_graphs([CYCLE4, PATH4])
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=256)
    keys = paillier_keypairs(256, topo.n_nodes)
    runs = []
    for lanes in (None, ThreadLanes(3)):
        monkeypatch.setattr(obfuscation, "secrets", _SeededSecrets(7))
        monkeypatch.setattr(seeds, "_token", _SeededSecrets(11).token_bytes)  # the masked protocol's seeds
        ex = bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, workers=0, djn=djn,
                                    record_transcript=True), topo)
        ex.rounds.lanes = lanes
        out = drive([ex], topo, lk=40, n_iter=3, seed=3, skip_step1=(1,))[0]
        per_iter = [{k: r[k] for k in COUNT_KEYS} for r in ex.pop_iteration_costs()]
        runs.append((out, list(ex.transcript), per_iter))
        ex.close()
    (a, wire_a, cost_a), (b, wire_b, cost_b) = runs
    assert_same(a, b)
    assert wire_a == wire_b and len(wire_a) > 0
    assert cost_a == cost_b
    assert lanes.helper_chunks > 0


def test_thread_lanes_map_in_order_on_every_lane():
    import threading

    seen = set()

    def square(x):
        seen.add(threading.get_ident())
        return x * x

    lanes = ThreadLanes(3)
    assert lanes.map(square, range(10)) == [x * x for x in range(10)]
    assert lanes.helper_chunks == 2 and len(seen) >= 2  # the caller's thread and a helper
    assert lanes.map(square, [4]) == [16] and lanes.helper_chunks == 2  # one item: no helper
    assert lanes.map(square, []) == []
    assert ThreadLanes(1).map(square, range(4)) == [0, 1, 4, 9]
    lanes.close()
    assert lanes.map(square, range(4)) == [0, 1, 4, 9]  # closed lanes start new threads when used again
    lanes.close()
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(lanes)


def test_thread_lanes_raise_the_first_error_after_every_chunk_finished():
    finished = []

    def task(x):
        if x in (3, 7):
            raise ValueError(f"bad {x}")
        finished.append(x)
        return x

    lanes = ThreadLanes(2)  # chunks [0..4], [5..9]: the first chunk's error is the one a loop meets
    with pytest.raises(ValueError, match="bad 3"):
        lanes.map(task, range(10))
    assert sorted(finished) == [0, 1, 2, 5, 6]  # the second chunk ran up to its own error
    with pytest.raises(ValueError, match="bad 7"):
        lanes.map(task, range(5, 10))

    def interrupted(x):  # Ctrl-C in the caller's chunk: the helper's chunk still finishes first
        if x == 0:
            raise KeyboardInterrupt
        time.sleep(0.05)
        finished.append(x)

    finished.clear()
    with pytest.raises(KeyboardInterrupt):
        lanes.map(interrupted, range(2))
    assert finished == [1]
    lanes.close()


def test_full_small_fit_with_every_fast_path_equals_quantized(paillier_keypairs):
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(6, 2, generator=gen, dtype=torch.float64)
    Z = X @ torch.rand(2, 14, generator=gen, dtype=torch.float64)
    kw = dict(bcd_iters=2, x_iters=3, y_iters=3, key_bits=128, n_max=1e6, seed=5)
    rq = fit(Z, CYCLE4, 2, exchange="quantized", **kw)
    for protocol in PROTOCOLS:
        opts = dict(keypairs=paillier_keypairs(128, 4), packing=True, precompute=True, djn=True, workers=2)
        rp = fit(Z, CYCLE4, 2, exchange="paillier", exchange_options=opts, **dict(kw, protocol=protocol))
        rq_p = fit(Z, CYCLE4, 2, exchange="quantized", **dict(kw, protocol=protocol))
        assert torch.equal(rq_p.X, rp.X) and torch.equal(rq_p.U, rp.U)
        assert all(torch.equal(a, b) for a, b in zip(rq_p.Y, rp.Y))
        for k, v in rq_p.history.items():
            if not k.startswith("time_"):
                assert rp.history[k] == v, k
        assert rp.costs["encryptions"] > 0
    assert torch.equal(rq.X, rq_p.X)  # the protocol does not change the numbers


# ------------------------------------------------------------------------- packing
@pytest.mark.parametrize("key_bits,slots", [(64, 1), (128, 2), (512, 8), (1024, 16), (2048, 32), (4096, 64)])
def test_slot_width_is_derived_from_the_codec_range(key_bits, slots):
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=key_bits)
    lay = derive_layout(codec)
    # values in (-limit, limit) plus the offset limit fill [1, 2 limit) = [1, 2^w)
    assert lay.slot_bits == codec.limit.bit_length() and lay.limit == codec.limit
    assert lay.slots == slots == (key_bits - 2) // lay.slot_bits
    assert lay.slots * lay.slot_bits <= key_bits - 2  # the packed word stays below n / 2
    assert derive_layout(codec, packing=False).slots == 1
    assert lay.n_ciphertexts(150) == -(-150 // slots)


def test_narrower_slots_and_bad_slot_bits():
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=512)
    lay = derive_layout(codec, slot_bits=40)
    assert (lay.slot_bits, lay.slots, lay.limit) == (40, 12, 1 << 39)
    for bad in (1, 64, 2.5, True):
        with pytest.raises(ConfigError, match="slot_bits"):
            derive_layout(codec, slot_bits=bad)
    with pytest.raises(ConfigError, match="slot_bits"):
        make_exchange("paillier", key_bits=512, slot_bits=80)
    with pytest.raises(ConfigError, match="slot_bits"):
        make_exchange("quantized", key_bits=512, cost_model=True, packing=True, slot_bits=80)


def test_pack_unpack_round_trip_exact(paillier_keypairs):
    (pk, sk), = paillier_keypairs(128, 1)
    n = pk.n
    for lay in (derive_layout(IntegerCodec(key_bits=128)), derive_layout(IntegerCodec(key_bits=128), slot_bits=20)):
        L = lay.limit
        vals = [0, 1, -1, L - 1, -(L - 1), 12345, -L // 3, 7]
        res = lay.pack(vals, n)
        assert len(res) == lay.n_ciphertexts(len(vals))
        assert lay.unpack(res, n, len(vals)) == vals
        # through real encryption and the homomorphic operations: 3 * (a + b) slot by slot
        a, b = vals, [-v // 2 for v in vals]
        ca = [pk.raw_encrypt(m) for m in lay.pack(a, n)]
        cb = [pk.raw_encrypt(m) for m in lay.pack(b, n)]
        nsq = pk.nsquare
        c = [pow(x * y % nsq, 3, nsq) for x, y in zip(ca, cb)]
        want = [3 * (x + y) for x, y in zip(a, b)]
        if max(abs(v) for v in want) < L:
            assert lay.unpack([sk.raw_decrypt(x) for x in c], n, len(vals)) == want
        # a slot that outgrew the limit does not decode
        with pytest.raises(SlotDecodeError):
            lay.unpack(lay.pack([L] + [0] * (lay.slots - 1), n), n, lay.slots)


def _overflow_case():
    """PATH3 with gamma_01 = 0: agent 0's reply from agent 1 is gamma_10 (q_1 - q_0) >= 2^62,
    yet every neighbour sum B_i is 0, so the codec (and quantized) accept the inputs."""
    topo = Topology.from_graphs([PATH3])
    g = torch.ones(topo.n_directed_edges, dtype=torch.float64)
    g[0] = 1e-7  # edge 0 -> 1: gamma_01 = round(2^16 1e-7) = 0
    U = torch.zeros((3, 4), dtype=torch.float64)
    U[1:, 2] = 1e8  # q_1 = q_2 = 1e14, q_0 = 0: gamma_10 |q_1 - q_0| = 2^16 1e14 > 2^62
    return topo, g, U


def test_reply_overflow_raises_identically_on_naive_and_fast_paths(paillier_keypairs):
    topo, g, U = _overflow_case()
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=512)
    keys = paillier_keypairs(512, 3)
    # the neighbour sums fit the codec (gamma_ij weighs the big reply by 0), one reply does
    # not: quantized emulates the paper protocol's per-reply check, and every path refuses
    # before anything is encrypted
    errs = []
    q = bound(QuantizedExchange(codec, protocol="paper"), topo)
    with pytest.raises(CodecRangeError, match="does not fit the codec limit") as err:
        q.exchange(U, g, bcd_iter=2, admm_iter=3)
    errs.append(err.value)
    bound(QuantizedExchange(codec, protocol="aggregated"), topo).exchange(U, g)  # no per-reply decryption
    for opts in (dict(fast=False), dict(packing=False, workers=0), dict(packing=True, workers=0)):
        p = bound(PaillierExchange(codec, protocol="paper", keypairs=keys, **opts), topo)
        with pytest.raises(CodecRangeError, match="does not fit the codec limit") as err:
            p.exchange(U, g, bcd_iter=2, admm_iter=3)
        errs.append(err.value)
        assert p.costs()["encryptions"] == 0
    for e in errs[1:]:
        assert str(e) == str(errs[0])
        assert (e.trial, e.agent, e.bcd_iter, e.admm_iter, e.value, e.limit) == \
               (errs[0].trial, errs[0].agent, errs[0].bcd_iter, errs[0].admm_iter, errs[0].value, errs[0].limit)
    assert (errs[0].agent, errs[0].value, errs[0].limit) == (0, (1 << 16) * 10**14, 1 << 62)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_value_that_does_not_fit_a_narrow_slot_raises(protocol, paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4])
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=512)
    keys = paillier_keypairs(512, 4)
    U = torch.rand((4, 5), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    g = torch.full((8,), 0.5, dtype=torch.float64)
    # |q| ~ 1e6, gamma ~ 2^15: per-reply values ~ 2^35, neighbour sums ~ 2^51
    narrow = bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, slot_bits=30, workers=0), topo)
    with pytest.raises(CodecRangeError, match="slot limit") as err:
        narrow.exchange(U, g, bcd_iter=1, admm_iter=2)
    assert err.value.limit == 1 << 29 and err.value.value >= 1 << 29 and err.value.admm_iter == 2
    assert narrow.costs()["encryptions"] == 0  # refused before anything was encrypted
    # quantized with the same slot_bits emulates the check: the same error
    emul = bound(QuantizedExchange(codec, protocol=protocol, packing=True, slot_bits=30), topo)
    with pytest.raises(CodecRangeError, match="slot limit") as err_q:
        emul.exchange(U, g, bcd_iter=1, admm_iter=2)
    assert str(err_q.value) == str(err.value) and err_q.value.value == err.value.value
    # unpacked, narrow slots still bound every plaintext: paillier and quantized agree
    for kind in (PaillierExchange(codec, protocol=protocol, keypairs=keys, slot_bits=30, packing=False, workers=0),
                 QuantizedExchange(codec, protocol=protocol, packing=False, slot_bits=30)):
        with pytest.raises(CodecRangeError, match="slot limit"):
            bound(kind, topo).exchange(U, g, bcd_iter=1, admm_iter=2)
    # wide enough narrow slots: same bits as quantized, fewer ciphertexts than the derived layout
    wide = bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, slot_bits=56, workers=0), topo)
    q = bound(QuantizedExchange(codec, protocol=protocol), topo)
    a, b = q.exchange(U, g), wide.exchange(U, g)
    assert torch.equal(a.S, b.S) and torch.equal(a.rho, b.rho)
    assert wide.layout.slots == 9 > derive_layout(codec).slots


# -------------------------------------------------------------------- obfuscators
def _phi(sk):
    return (gmpy2.mpz(sk.p) - 1) * (gmpy2.mpz(sk.q) - 1)


def _is_nth_residue(y, pk, sk):
    """``y`` is an ``n``-th residue mod ``n^2`` iff ``y^phi(n) = 1`` (the subgroup of order phi(n))."""
    return gmpy2.powmod(gmpy2.mpz(y), _phi(sk), pk.nsquare) == 1


@pytest.mark.parametrize("bits", [128, 512])
def test_owner_crt_encryption_decrypts_and_matches_r_to_the_n(bits, paillier_keypairs):
    (pk, sk), = paillier_keypairs(bits, 1)
    crt = PrivateCRT(sk)
    n, nsq = gmpy2.mpz(pk.n), gmpy2.mpz(pk.nsquare)
    obs = crt.obfuscators(20)
    assert all(_is_nth_residue(o, pk, sk) for o in obs) and len(set(obs)) == 20
    vals = [0, 1, 5, int(n) - 1, int(n) // 2, 123456789]
    cts = [(1 + n * m) * o % nsq for m, o in zip(vals, obs)]
    assert [sk.raw_decrypt(int(c)) for c in cts] == vals  # phe decrypts the owner's encryptions
    assert crt.decrypt(cts) == vals  # and so does the mpz CRT decryption
    # exactly phe's obfuscator r^n for r in Z_n^* given by a bijection of the seeds
    p, q = gmpy2.mpz(sk.p), gmpy2.mpz(sk.q)
    for t_p, t_q in ((2, 3), (int(p) - 1, 12345), (777, int(q) - 2)):
        r_p = gmpy2.powmod(t_p, gmpy2.invert(q, p - 1), p)
        r_q = gmpy2.powmod(t_q, gmpy2.invert(p, q - 1), q)
        r = r_p + p * ((r_q - r_p) * gmpy2.invert(p, q) % q)
        assert crt._from_seeds([t_p], [t_q]) == [gmpy2.powmod(r, n, nsq)]


@pytest.mark.parametrize("threaded", [False, True])
def test_owner_crt_halves_in_two_threads_give_the_same_numbers(threaded, monkeypatch, paillier_keypairs):
    """From CRT_THREAD_MIN_BITS up the two CRT halves run side by side (the helper thread
    takes the q half): decryption and the owner's obfuscators are the same numbers."""
    from ppdnmf_torch.exchange.paillier import obfuscation

    (pk, sk), = paillier_keypairs(128, 1)
    monkeypatch.setattr(obfuscation, "CRT_THREAD_MIN_BITS", 64 if threaded else 1 << 20)
    handed = []
    real = obfuscation._half_thread
    monkeypatch.setattr(obfuscation, "_half_thread", lambda: handed.append(1) or real())
    crt = PrivateCRT(sk)
    n, nsq = gmpy2.mpz(pk.n), gmpy2.mpz(pk.nsquare)
    p, q = gmpy2.mpz(sk.p), gmpy2.mpz(sk.q)
    t_p, t_q = [2, 777, int(p) - 1], [3, 12345, int(q) - 2]
    want = []
    for a, b in zip(t_p, t_q):  # CRT(t_p^p mod p^2, t_q^q mod q^2), one at a time
        x, y = gmpy2.powmod(a, p, p * p), gmpy2.powmod(b, q, q * q)
        want.append(x + p * p * ((y - x) * gmpy2.invert(p * p, q * q) % (q * q)))
    assert crt._from_seeds(t_p, t_q) == want
    vals = [0, 1, 5, int(n) - 1, 123456789]
    cts = [(1 + n * m) * o % nsq for m, o in zip(vals, crt.obfuscators(len(vals)))]
    assert crt.decrypt(cts) == vals == [sk.raw_decrypt(int(c)) for c in cts]
    assert crt.decrypt([]) == []
    assert len(handed) == (3 if threaded else 0)  # seeds, obfuscators, decryption (none for no ciphertexts)


def test_owner_crt_halves_fall_back_to_one_thread_at_shutdown(monkeypatch, paillier_keypairs):
    """After interpreter shutdown has begun no new work can go to a thread: decryption then
    runs both halves in the caller's thread, and raises nothing (no frame holding p and q
    ends up in a traceback)."""
    from concurrent.futures import ThreadPoolExecutor

    from ppdnmf_torch.exchange.paillier import obfuscation

    (pk, sk), = paillier_keypairs(128, 1)
    monkeypatch.setattr(obfuscation, "CRT_THREAD_MIN_BITS", 64)
    closed = ThreadPoolExecutor(max_workers=1)
    closed.shutdown()
    monkeypatch.setattr(obfuscation, "_half_thread", lambda: closed)
    crt = PrivateCRT(sk)
    n, nsq = gmpy2.mpz(pk.n), gmpy2.mpz(pk.nsquare)
    vals = [0, 7, int(n) - 1]
    cts = [(1 + n * m) * o % nsq for m, o in zip(vals, crt.obfuscators(len(vals)))]
    assert crt.decrypt(cts) == vals


@pytest.mark.parametrize("bits", [128, 512])
def test_djn_encryptions_decrypt(bits, paillier_keypairs):
    (pk, sk), = paillier_keypairs(bits, 1)
    n, nsq = gmpy2.mpz(pk.n), gmpy2.mpz(pk.nsquare)
    xb = default_djn_exponent_bits(bits)
    obs = djn_obfuscators(n, 12, xb)
    assert all(_is_nth_residue(o, pk, sk) for o in obs) and len(set(obs)) == 12
    vals = list(range(-6, 6))
    cts = [(1 + n * (v % n)) * o % nsq for v, o in zip(vals, obs)]
    assert [sk.raw_decrypt(int(c)) for c in cts] == [v % pk.n for v in vals]
    # the fixed-base table computes exactly h_s^x
    hs = djn_base(n)
    tab = FixedBaseTable(hs, nsq, 40, window=5)
    for x in (0, 1, 31, 32, (1 << 40) - 1, 987654321):
        assert tab.power(x) == gmpy2.powmod(hs, x, nsq)
    assert djn_base(n) == hs  # derived from n alone: every party computes the same public base
    assert security_bits(2048) == 112 and default_djn_exponent_bits(2048) == 224


def test_obfuscator_pool_yields_valid_obfuscators(paillier_keypairs):
    keys = paillier_keypairs(128, 3)
    moduli = {i: pk.n for i, (pk, _) in enumerate(keys)}
    pool = WorkerPool(2)
    try:
        for djn_bits, stock in ((None, {0: 6, 1: 6, 2: 6}), (160, None)):
            sup = ObfuscatorSupply(moduli, djn_bits=djn_bits, pool=pool, stock=stock, chunk=4)
            assert sup.mode == ("stock" if stock else "batch")
            sup.refill()
            got = sup.take({0: 5, 2: 9})
            sup.refill()
            got2 = sup.take({0: 7, 1: 1})
            for out in (got, got2):
                for i, obs in out.items():
                    pk, sk = keys[i]
                    assert all(_is_nth_residue(o, pk, sk) for o in obs)
            assert [len(got[0]), len(got[2]), len(got2[0]), len(got2[1])] == [5, 9, 7, 1]
            every = got[0] + got[2] + got2[0] + got2[1]
            assert len(set(every)) == len(every)  # fresh every time
            sup.close()
    finally:
        pool.close()
    assert all(_is_nth_residue(o, keys[0][0], keys[0][1]) for o in random_obfuscators(keys[0][0].n, 3))


# ------------------------------------------------------------------- key privacy
def _secret_forms(sk):
    """Byte and text forms in which p or q could appear in a pickle or a transcript."""
    forms = []
    for s in (int(sk.p), int(sk.q)):
        k = (s.bit_length() + 8) // 8
        forms += [s.to_bytes(k, "little", signed=True)[:12], s.to_bytes(k, "big")[-12:],
                  str(s)[:16].encode(), format(s, "x")[:16].encode()]
    return forms


def test_no_private_key_material_reaches_the_workers_or_the_wire(paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4])
    keys = paillier_keypairs(512, 4)
    sent = []
    ex = PaillierExchange(IntegerCodec(key_bits=512), keypairs=keys, workers=2, precompute=True,
                          record_transcript=True, pool_audit=sent.append)
    bound(ex, topo)
    drive([ex], topo, lk=9, n_iter=2, seed=0, skip_step1=(1,))
    assert sent, "the pool received no task"
    public_n = {pk.n for pk, _ in keys}
    for payload in sent:
        for _, sk in keys:
            for form in _secret_forms(sk):
                assert form not in payload
        # every integer argument is a public modulus or a small count / exponent size
        for arg in pickle.loads(payload):
            if isinstance(arg, int) and arg.bit_length() > 64:
                assert arg in public_n
        assert all(op.name not in ("GLOBAL", "STACK_GLOBAL", "REDUCE") for op, _, _ in pickletools.genops(payload))
    # the transcript: ciphertexts and public keys only
    assert ex.transcript
    wire = {v for msg in ex.transcript for v in msg.payload}
    for pk, sk in keys:
        assert sk.p not in wire and sk.q not in wire
        assert not any(v % sk.p == 0 for v in wire if v not in public_n)  # no multiple of p but n
    assert public_n <= wire
    # nothing with keys can be pickled or copied
    for obj in (ex, ex.agents[0], ex.rounds.pool):
        with pytest.raises(TypeError):
            pickle.dumps(obj)
    with pytest.raises(TypeError, match="private-key material"):
        pickle.dumps(PrivateCRT(keys[0][1]))
    with pytest.raises(TypeError):
        copy.deepcopy(PrivateCRT(keys[0][1]))
    assert "p=" not in repr(PrivateCRT(keys[0][1])) and str(keys[0][1].p) not in repr(ex)
    ex.close()


def test_fast_and_naive_transcripts_have_the_same_shape(paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4])
    keys = paillier_keypairs(128, 4)
    codec = IntegerCodec(key_bits=128)
    for protocol in PROTOCOLS:
        naive = bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, fast=False, record_transcript=True),
                      topo)
        fast = bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, packing=False, workers=0,
                                      record_transcript=True), topo)
        packed = bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, workers=0, record_transcript=True),
                       topo)
        drive([naive, fast, packed], topo, lk=6, n_iter=2, seed=1, skip_step1=(1,))

        def shape(ex):
            return [(m.bcd_iter, m.admm_iter, m.sender, m.receiver, m.kind, len(m.payload)) for m in ex.transcript]

        assert shape(naive) == shape(fast)
        # packed: the same messages, 2 values per ciphertext (and, masked, the shifted encryptions
        # of the second slot, which an unpacked message does not need)
        kinds = [(m.sender, m.receiver, m.kind) for m in naive.transcript]
        packed_msgs = [m for m in packed.transcript if m.kind != "enc_shifted"]
        assert kinds == [(m.sender, m.receiver, m.kind) for m in packed_msgs]
        assert (protocol == "masked") == any(m.kind == "enc_shifted" for m in packed.transcript)
        for a, b in zip(naive.transcript, packed_msgs):
            if a.kind in ("enc_neg_u", "enc_reply", "enc_masked_reply"):
                assert len(b.payload) == len(a.payload) // 2
        assert naive.bytes_per_edge() == fast.bytes_per_edge()


# ------------------------------------------------------------------- counts, options
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_counts_of_every_fast_path_match_the_packed_cost_model(protocol, paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4, PATH4])
    codec = IntegerCodec(key_bits=512)
    keys = paillier_keypairs(512, topo.n_nodes)
    q = bound(QuantizedExchange(codec, protocol=protocol, cost_model=True, packing=True), topo)
    ps = [bound(PaillierExchange(codec, protocol=protocol, keypairs=keys, **c), topo)
          for c in (dict(workers=0), dict(djn=True, workers=0), dict(precompute=False, workers=0))]
    drive([q] + ps, topo, lk=LK, n_iter=2, seed=4, skip_step1=(1,))
    want = q.pop_iteration_costs()
    for p in ps:
        got = p.pop_iteration_costs()
        assert [{k: r[k] for k in COUNT_KEYS} for r in got] == [{k: r[k] for k in COUNT_KEYS} for r in want]
        assert p.bytes_per_edge() == q.bytes_per_edge()
    # 11 values in 8 slots: 2 ciphertexts per message, not 11
    assert want[0]["decryptions"] == (8 * 2 + 8 if protocol != "paper" else 14 * 2)


def test_options_and_defaults():
    assert {"fast", "packing", "slot_bits", "precompute", "djn", "djn_exponent_bits", "workers"} <= \
        set(EXCHANGE_OPTIONS["paillier"])
    assert {"packing", "slot_bits"} <= set(EXCHANGE_OPTIONS["quantized"])
    ex = make_exchange("paillier", key_bits=2048)
    assert (ex.fast, ex.packing, ex.precompute, ex.djn) == (True, True, True, False)
    assert ex.layout.slots == 32 and ex.djn_exponent_bits is None
    assert make_exchange("paillier", key_bits=2048, djn=True).djn_exponent_bits == 224
    assert make_exchange("paillier", key_bits=2048, fast=False).layout is None
    assert resolve_workers(None, 128) == 0 and resolve_workers(0, 2048) == 0 and resolve_workers(1, 2048) == 0
    assert resolve_workers(3, 128) == 3
    for bad in (dict(workers=-1), dict(workers=1.5), dict(djn="yes"), dict(packing=None), dict(fast=1),
                dict(djn_exponent_bits=8)):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            make_exchange("paillier", key_bits=2048, **bad)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_naive_reply_to_a_zero_penalty_is_obfuscated(protocol, paillier_keypairs):
    # gamma_ji = 0 made [E(q_j) E(-q_i)]^0 the ciphertext 1 on the wire; the reply is now
    # E(-q_i)^gamma E(gamma q_j): freshly randomized whatever gamma, same numbers
    topo = Topology.from_graphs([PATH3])
    codec = IntegerCodec(n_max=1e4, g_bits=8, key_bits=128)
    U = torch.rand((3, 4), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    g = torch.tensor([0.5, 0.0, 0.7, 0.4], dtype=torch.float64)  # edge 1 -> 0 draws a zero penalty
    naive = bound(PaillierExchange(codec, protocol=protocol, keypairs=paillier_keypairs(128, 3), fast=False,
                                   record_transcript=True), topo)
    q = bound(QuantizedExchange(codec, protocol=protocol), topo)
    a, b = naive.exchange(U, g), q.exchange(U, g)
    assert torch.equal(a.S, b.S) and torch.equal(a.rho, b.rho)
    replies = [c for msg in naive.transcript if msg.kind in ("enc_reply", "enc_masked_reply") for c in msg.payload]
    assert len(replies) == 4 * 4 and all(int(c) != 1 for c in replies)
    assert len({int(c) for c in replies}) == len(replies)


def test_short_djn_exponents_warn():
    from ppdnmf_torch.exchange.paillier import InsecureKeyWarning

    with pytest.warns(InsecureKeyWarning, match="djn_exponent_bits=64"):
        ex = make_exchange("paillier", key_bits=2048, djn=True, djn_exponent_bits=64)
    assert "djn (64-bit exponents)" in repr(ex)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_exchange("paillier", key_bits=2048, djn=True)  # the default, 224 bits: no warning
        make_exchange("paillier", key_bits=2048, djn=True, djn_exponent_bits=1024)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("g_value,match", [(4.0, "do not fit 2\\^62"), (1.0, r"rho_i = sum_j gamma_ij gamma_ji")])
def test_penalties_out_of_range_raise_before_anything_is_encrypted(protocol, g_value, match, paillier_keypairs):
    # g_bits=30: g=4 gives gamma=2^32, whose products wrap int64 (quantized returned S=0
    # silently); g=1 gives gamma_ij gamma_ji=2^60, and the star's centre sums four of them
    from ppdnmf_torch import graph

    topo = Topology.from_graphs([graph.star(5)])
    codec = IntegerCodec(n_max=10, g_bits=30, key_bits=256)
    U = torch.rand((5, 3), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    g = torch.full((8,), g_value, dtype=torch.float64)
    errs = []
    exchanges = [bound(QuantizedExchange(codec, protocol=protocol), topo)]
    exchanges += [bound(PaillierExchange(codec, protocol=protocol, keypairs=paillier_keypairs(256, 5), **o), topo)
                  for o in (dict(fast=False), dict(workers=0))]
    for ex in exchanges:
        for step in (ex.penalty_sums, lambda g, **kw: ex.exchange(U, g, **kw)):
            with pytest.raises(CodecRangeError, match=match) as err:
                step(g, bcd_iter=1, admm_iter=2)
            errs.append(str(err.value))
        if isinstance(ex, PaillierExchange):
            assert ex.costs()["encryptions"] == 0
    assert len(set(errs)) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_paillier_step5_reuses_step1_penalty_encoding(protocol, monkeypatch, paillier_keypairs):
    codec = IntegerCodec(n_max=1e4, g_bits=16, key_bits=128)
    topo = Topology.from_graphs([CYCLE4])
    ex = bound(PaillierExchange(codec, protocol=protocol, keypairs=paillier_keypairs(128, 4), workers=0), topo)
    ref = bound(QuantizedExchange(codec, protocol=protocol), topo)
    calls, U, g = penalty_encodings(monkeypatch, topo, 3, 5)
    ex.penalty_sums(g)
    a = ex.exchange(U, g)
    assert len(calls) == 1
    b = ex.exchange(U, g)  # no step 1 before it: encoded here, same bits
    assert len(calls) == 2 and torch.equal(a.S, b.S)
    want = ref.exchange(U, g)
    assert torch.equal(a.S, want.S) and torch.equal(a.rho, want.rho)
