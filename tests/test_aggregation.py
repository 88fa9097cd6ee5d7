"""Secure aggregation (exchange/aggregation.py, exchange/paillier/aggregation.py, audit/server.py):
the server's sum equals the plain sum (integers: bit for bit), quantized == paillier bit for bit,
dropped workers refused, ranges never wrap, seeds and keys never leave their objects."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch.exchange.aggregation import (
    DEFAULT_N_MAX,
    RING_BITS,
    DroppedWorkerError,
    make_aggregator,
    ring_sum,
    round_counts,
    setup_counts,
    signed_lift,
)
from ppdnmf_torch.exchange.codec import CodecRangeError
from ppdnmf_torch.exchange.costmodel import seed_chunks

SMALL_KEY = 256


def _uploads(shape, seed=0, scale=1.0, dtype=torch.float64, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype=dtype, device=device)


def _integer_sum(values, dim, n_max=DEFAULT_N_MAX):
    """The reference: the exact integer sum of the quantized uploads, decoded."""
    q = torch.round(values.to(torch.float64) * n_max).to(torch.int64)
    return (q.sum(dim).to(torch.float64) / n_max).to(values.dtype)


# --------------------------------------------------------------------------- the ring
def test_ring_sum_is_exact_mod_2_63():
    gen = torch.Generator().manual_seed(1)
    y = torch.randint(0, 2**62, (7, 5), generator=gen, dtype=torch.int64) * 2 + torch.randint(0, 2, (7, 5),
                                                                                              generator=gen)
    got = ring_sum(y, 0).tolist()
    want = [sum(int(v) for v in col) % 2**RING_BITS for col in y.T.tolist()]
    assert got == want
    s = torch.tensor([0, 2**62 - 1, 2**62, 2**63 - 1])
    assert signed_lift(s).tolist() == [0, 2**62 - 1, -(2**62), -1]


# --------------------------------------------------------------------------- plain and quantized
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape,dim", [((3, 4, 6, 2), 1), ((4, 5), 0), ((2, 3, 7), -2)])
def test_totals_equal_the_sum(device, dtype, shape, dim):
    v = _uploads(shape, seed=len(shape), dtype=dtype, device=device)
    K = shape[dim]
    plain = make_aggregator("plain", K).total(v, dim)
    assert torch.equal(plain, v.sum(dim))
    q = make_aggregator("quantized", K)
    got = q.total(v, dim)
    assert got.dtype == dtype and got.device == v.device and got.shape == plain.shape
    # the exact integer sum, bit for bit, whatever the masks
    assert torch.equal(got, _integer_sum(v, dim))
    tol = K / DEFAULT_N_MAX if dtype == torch.float64 else 1e-5
    assert torch.allclose(got.double(), v.double().sum(dim), atol=tol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_integer_uploads_sum_to_the_plain_sum_bit_for_bit(device, dtype):
    """Counts (centring's n_i) and values on the codec's grid (k / n_max) are summed exactly: the secure
    total is the plain sum, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    counts = torch.randint(0, 10**6, (7, 2, 5), generator=gen).to(dtype=dtype, device=device)
    grid = (torch.randint(-2**20, 2**20, (7, 2, 5), generator=gen).to(torch.float64) / 2**10).to(dtype=dtype,
                                                                                                  device=device)
    agg = make_aggregator("quantized", 7)
    for v in (counts, grid):
        assert torch.equal(agg.total(v, 0), v.sum(0))


@pytest.mark.parametrize("K", [2, 3, 9])
def test_quantized_masks_hide_each_upload_and_cancel(K):
    v = _uploads((K, 64), seed=K)
    agg = make_aggregator("quantized", K, seed=5, record=True)
    s1 = agg.total(v, 0)
    s2 = agg.total(v, 0)
    assert torch.equal(s1, s2) and torch.equal(s1, _integer_sum(v, 0))
    t1, t2 = agg.transcript
    q = t1["q"]
    # the server's uploads are not the quantized values, and a round's masks are fresh
    assert not (t1["uploads"] == (q & (2**RING_BITS - 1))).any()
    assert not (t1["uploads"] == t2["uploads"]).any()
    # each upload is spread over the whole ring (top bit set about half of the time)
    top = (t1["uploads"] >> (RING_BITS - 1)).double().mean()
    assert 0.3 < float(top) < 0.7
    # same seed, same transcript; another seed, other uploads, the same sum
    again = make_aggregator("quantized", K, seed=5, record=True)
    again.total(v, 0)
    assert torch.equal(again.transcript[0]["uploads"], t1["uploads"])
    other = make_aggregator("quantized", K, seed=6, record=True)
    assert torch.equal(other.total(v, 0), s1)
    assert not torch.equal(other.transcript[0]["uploads"], t1["uploads"])


def test_dim_is_required_when_ambiguous():
    agg = make_aggregator("quantized", 3)
    v = _uploads((3, 3, 2))
    with pytest.raises(ConfigError, match="dim"):
        agg.total(v)
    assert torch.equal(agg.total(v, dim=1), _integer_sum(v, 1))
    with pytest.raises(DataError, match="n_workers=3"):
        agg.total(_uploads((3, 4)), dim=1)
    with pytest.raises(DataError, match="floating-point"):
        agg.total(torch.ones(3, 2, dtype=torch.int64), dim=0)


@pytest.mark.parametrize("kind", ["plain", "quantized"])
@pytest.mark.parametrize("dropped", [[1], torch.tensor([False, True, False, True])])
def test_a_dropped_worker_is_refused_naming_it(kind, dropped):
    agg = make_aggregator(kind, 4)
    with pytest.raises(DroppedWorkerError, match="worker") as exc:
        agg.total(_uploads((4, 3)), 0, dropped=dropped)
    want = [1] if isinstance(dropped, list) else [1, 3]
    assert list(exc.value.workers) == want and exc.value.round == 1
    assert agg.rounds == 0  # nothing was summed
    assert torch.equal(agg.total(_uploads((4, 3)), 0, dropped=[]), _integer_sum(_uploads((4, 3)), 0)
                       if kind == "quantized" else _uploads((4, 3)).sum(0))


def test_range_checks_refuse_never_wrap():
    agg = make_aggregator("quantized", 3, n_max=2.0**40)
    big = torch.zeros(3, 4, dtype=torch.float64)
    big[1, 2] = 2.0**22  # 2^62 once quantized: one upload out of range
    with pytest.raises(CodecRangeError, match="worker 1"):
        agg.total(big, 0)
    near = torch.full((3, 4), 2.0**21, dtype=torch.float64)  # each fits; their sum bound 1.5 * 2^62 does not
    with pytest.raises(CodecRangeError, match="entry 0"):
        agg.total(near, 0)
    narrow = make_aggregator("quantized", 3, n_max=2.0**8, bits=12)  # slots of 12 bits: |sum| < 2^11
    ok = torch.full((3, 2), 2.0, dtype=torch.float64)  # 3 * 512 < 2048
    assert torch.equal(narrow.total(ok, 0), ok.sum(0))
    with pytest.raises(CodecRangeError, match="slot limit"):
        narrow.total(torch.full((3, 2), 3.0, dtype=torch.float64), 0)
    with pytest.raises(CodecRangeError):
        agg.total(torch.tensor([[float("nan")], [0.0], [0.0]], dtype=torch.float64), 0)


def test_config_errors():
    with pytest.raises(ConfigError, match="kind"):
        make_aggregator("secret", 3)
    with pytest.raises(ConfigError, match="n_workers"):
        make_aggregator("quantized", 1)
    with pytest.raises(ConfigError, match="bits"):
        make_aggregator("quantized", 3, bits=64)
    with pytest.raises(ConfigError, match="n_max"):
        make_aggregator("quantized", 3, n_max=0.5)
    with pytest.raises(ConfigError, match="keypairs"):
        make_aggregator("quantized", 3, keypairs=[])


def test_quantized_seeds_never_leave():
    agg = make_aggregator("quantized", 4, record=True)
    for bad in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="key material"):
            bad(agg)
    for vault in agg._vaults:
        with pytest.raises(TypeError):
            pickle.dumps(vault)
    text = repr(agg) + str(agg.costs()) + repr(agg._vaults[0])
    for vault in agg._vaults:
        for s in vault._seeds.values():
            assert s.hex() not in text and str(int.from_bytes(s, "big")) not in text
    agg.total(_uploads((4, 2)), 0)
    agg.close()
    assert all(len(v) == 0 for v in agg._vaults)
    with make_aggregator("quantized", 3) as scoped:  # a with block closes it
        scoped.total(_uploads((3, 2)), 0)
    assert all(len(v) == 0 for v in scoped._vaults)
    with pytest.raises(ConfigError, match="closed"):
        agg.total(_uploads((4, 2)), 0)


def test_costs_are_counted_per_round():
    K, P = 5, 70
    agg = make_aggregator("quantized", K, key_bits=2048)
    agg.total(_uploads((K, P)), 0)
    agg.total(_uploads((2, K, P)), 1)
    c = agg.costs()
    assert c["rounds"] == 2 and c["uploads"] == 3 * P and c["bytes"] == 8 * K * 3 * P
    assert c["prg_bytes"] == 8 * 3 * P * K * (K - 1) // 2
    one = round_counts(K, P, key_bits=2048)
    two = round_counts(K, 2 * P, key_bits=2048)
    assert one["slots"] == 32 and one["ciphertexts"] == 3
    assert c["model_encryptions"] == one["encryptions"] + two["encryptions"] == 3 + 5  # the designated worker's
    assert c["model_decryptions"] == 3 + 5
    assert c["model_setup_encryptions"] == K * (K - 1) // 2
    rounds = agg.pop_round_costs()
    assert [r["round"] for r in rounds] == [1, 2] and rounds[0]["bytes"] == 8 * K * P
    assert agg.pop_round_costs() == []
    plain = make_aggregator("plain", K)
    plain.total(_uploads((K, P), dtype=torch.float32), 0)
    assert plain.costs()["bytes"] == 4 * K * P and plain.costs()["rounds"] == 1
    assert plain.costs()["encryptions"] == 0 == c["encryptions"]  # every kind has the contract's keys


# --------------------------------------------------------------------------- paillier
def _paillier(paillier_keypairs, K, **kw):
    import warnings

    from ppdnmf_torch.exchange.paillier import InsecureKeyWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureKeyWarning)
        return make_aggregator("paillier", K, key_bits=SMALL_KEY, keypairs=paillier_keypairs(SMALL_KEY, K + 1), **kw)


@pytest.mark.crypto
@pytest.mark.parametrize("K,shape,dim,dtype,bits,h,obf", [
    (3, (3, 17), 0, torch.float64, None, None, "designated"),
    (4, (2, 4, 5, 3), 1, torch.float32, None, None, "every"),
    (2, (6, 2), 1, torch.float64, 40, None, "designated"),
    (6, (6, 9), 0, torch.float64, None, 1, "designated"),
])
def test_paillier_equals_quantized_bit_for_bit(paillier_keypairs, K, shape, dim, dtype, bits, h, obf):
    agg = _paillier(paillier_keypairs, K, bits=bits, record=True, mask_neighbours=h, obfuscators=obf)
    emu = make_aggregator("quantized", K, key_bits=SMALL_KEY, bits=bits, mask_neighbours=h)
    for r in range(2):
        v = _uploads(shape, seed=10 + r, scale=3.0, dtype=dtype)
        got = agg.total(v, dim)
        assert torch.equal(got, emu.total(v, dim))
        assert torch.equal(got, _integer_sum(v, dim))
    # the server received K uploads of C ciphertexts each, none of which decrypts to its packed value
    P = _uploads(shape).numel() // K
    want = round_counts(K, P, key_bits=SMALL_KEY, bits=bits, mask_neighbours=h, obfuscators=obf)
    assert want["encryptions"] == (K if obf == "every" else 1) * want["ciphertexts"]
    c = agg.costs()
    for key in ("encryptions", "decryptions", "homomorphic_additions", "mask_units", "bytes"):
        assert c[key] == 2 * want[key], key
    assert c["setup_encryptions"] == len(agg.pairs) * seed_chunks(SMALL_KEY)
    assert len(agg.pairs) == (K * (K - 1) // 2 if h is None else K)
    assert c["setup_bytes"] == setup_counts(K, key_bits=SMALL_KEY, mask_neighbours=h)["setup_bytes"]
    rec = agg.transcript[-1]
    assert len(rec["uploads"]) == K and all(len(u) == want["ciphertexts"] for u in rec["uploads"])
    n = agg.server_modulus
    for i in range(K):
        packed = agg.layout.pack(rec["q"][i].tolist(), n)
        assert agg._decrypt_as_server(rec["uploads"][i]) != packed
        # every upload is re-randomized by its mask unit: none is the bare embedding 1 + n M
        assert all(int(c) % n != 1 for c in rec["uploads"][i])
    # an eavesdropper's product of the uploads is a fresh encryption of the sum, not 1 + n M(sum):
    # the designated worker's obfuscators randomize it (the mask units cancel in it)
    nsq = n * n
    for b in range(want["ciphertexts"]):
        prod = 1
        for up in rec["uploads"]:
            prod = prod * up[b] % nsq
        assert prod % n != 1


@pytest.mark.crypto
def test_paillier_refuses_drops_and_keeps_its_keys(paillier_keypairs):
    keys = paillier_keypairs(SMALL_KEY, 4)
    agg = _paillier(paillier_keypairs, 3)
    with pytest.raises(DroppedWorkerError, match="worker 2"):
        agg.total(_uploads((3, 4)), 0, dropped=[2])
    for bad in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError):
            bad(agg)
    text = repr(agg) + str(agg.costs())
    for _, sk in keys:
        assert str(sk.p) not in text and str(sk.q) not in text
    assert torch.equal(agg.total(_uploads((3, 4)), 0), _integer_sum(_uploads((3, 4)), 0))
    stores = [w._seeds for w in agg._workers]
    assert all(len(s) == 2 for s in stores)
    text += "".join(repr(w) + repr(s) for w, s in zip(agg._workers, stores))
    for store in stores:
        for seed in store._seeds.values():
            assert seed.hex() not in text and str(int.from_bytes(seed, "big")) not in text
    agg.close()
    assert all(len(s) == 0 for s in stores) and agg._server is None
    with pytest.raises(ConfigError, match="closed"):
        agg.total(_uploads((3, 4)), 0)
    with pytest.raises(ConfigError, match="obfuscators"):
        _paillier(paillier_keypairs, 3, obfuscators="none")


# --------------------------------------------------------------------------- the audit
@pytest.mark.parametrize("K", [2, 3, 5])
def test_audit_a_curious_server_learns_only_the_sum(K):
    from ppdnmf_torch.audit.server import run_server_audit

    rep = run_server_audit("quantized", K, rounds=6, n_values=48, seed=K)
    assert rep["sums_exact"]
    views = rep["views"]
    assert len(views) == K * K  # per target: the server, and the server with each other worker
    for v in views:
        if v["inherent"]:  # K = 2: the colluder's upload and the sum give the other one exactly
            assert v["exact_fraction"] == 1.0 and v["baseline_exact_fraction"] == 1.0
            continue
        assert v["exact_fraction"] == 0.0 and not v["learns_beyond_sum"]
        assert abs(v["corr"]) < v["corr_bound"] and v["ks"] < v["ks_bound"]
        assert v["rel_err_median"] > 1e6 * v["baseline_rel_err_median"]
    assert rep["verdict"]["server"] == "only the sum"
    assert rep["verdict"].get("server+worker", "only the sum") == "only the sum"
    assert ("server+worker" in rep["verdict"]) == (K >= 3)


def test_audit_positive_control_masks_off_exposes_every_upload():
    from ppdnmf_torch.audit.server import format_server_audit, run_server_audit

    rep = run_server_audit("quantized", 3, rounds=4, n_values=32, masks=False)
    assert rep["sums_exact"] and rep["verdict"] == {"server": "learns beyond the sum"}
    for v in rep["views"]:
        assert v["exact_fraction"] == 1.0 and v["corr"] > 0.999 and v["rel_err_median"] == 0.0
    table = format_server_audit([rep])
    assert "| quantized | 3 | off | server | 1 |" in table


@pytest.mark.crypto
def test_audit_paillier_server_decrypts_noise(paillier_keypairs):
    import warnings

    from ppdnmf_torch.audit.server import run_server_audit
    from ppdnmf_torch.exchange.paillier import InsecureKeyWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureKeyWarning)
        rep = run_server_audit("paillier", 3, rounds=4, n_values=40, key_bits=SMALL_KEY,
                               keypairs=paillier_keypairs(SMALL_KEY, 4))
    assert rep["sums_exact"]
    for v in rep["views"]:
        assert v["exact_fraction"] == 0.0 and v["rel_err_median"] > 1e6 * v["baseline_rel_err_median"]
    assert rep["verdict"] == {"server": "only the sum", "server+worker": "only the sum"}


@pytest.mark.parametrize("K,h,pairs", [(6, 1, 6), (7, 2, 14), (5, 2, 10), (4, None, 6)])
def test_sparse_mask_graph(K, h, pairs):
    from ppdnmf_torch.audit.server import server_views
    from ppdnmf_torch.exchange.aggregation import mask_pairs

    got = mask_pairs(K, h)
    assert len(got) == pairs and all(a < b for a, b in got)
    agg = make_aggregator("quantized", K, mask_neighbours=h, seed=1, record=True)
    v = _uploads((K, 40), seed=K)
    assert torch.equal(agg.total(v, 0), _integer_sum(v, 0))
    c = agg.costs()
    assert c["prg_bytes"] == 8 * 40 * pairs and c["model_setup_encryptions"] == pairs
    assert c["model_mask_units"] == 2 * pairs * round_counts(K, 40, key_bits=2048)["ciphertexts"]
    for _ in range(3):
        agg.total(_uploads((K, 40), seed=K + _), 0)
    views = server_views(agg)
    assert not any(v["learns_beyond_sum"] for v in views)
    with pytest.raises(ConfigError, match="mask_neighbours"):
        make_aggregator("quantized", K, mask_neighbours=0)
