"""Checkpoints, resume, determinism and key hygiene at the Python API level."""
from __future__ import annotations

import os
import pickle
import warnings

import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ppdnmf_torch.models.ppdnmf.solver import RunInterrupted

from conftest import FAKE_COSTS, small_problem

G = graph.random_connected(5, 2.4, seed=1)
KW = dict(bcd_iters=6, x_iters=4, y_iters=4, device="cpu", seed=4)


def _blocks():
    return small_problem(counts=(3, 4, 2, 5, 3), seed=9)


def _exchange_kw(kind, paillier_keypairs=None):
    if kind == "plain":
        return {}
    kw = {"exchange": kind, "n_max": 1e5, "key_bits": 128}
    if kind == "paillier":
        kw["exchange_options"] = {"keypairs": paillier_keypairs(128, 5)}
    return kw


@pytest.mark.parametrize("kind", ["plain", "quantized", pytest.param("paillier", marks=pytest.mark.crypto)])
def test_same_seed_same_bits(kind, paillier_keypairs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = pp.fit(_blocks(), G, 2, **KW, **_exchange_kw(kind, paillier_keypairs))
        b = pp.fit(_blocks(), G, 2, **KW, **_exchange_kw(kind, paillier_keypairs))
    assert torch.equal(a.X, b.X) and torch.equal(a.U, b.U)
    assert all(torch.equal(x, y) for x, y in zip(a.Y, b.Y))
    assert a.history["nmse"] == b.history["nmse"] and a.history["consensus"] == b.history["consensus"]


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("kind", ["plain", "quantized"])
def test_resume_is_bit_identical(tmp_path, every, kind):
    full = pp.fit(_blocks(), G, 2, **KW, **_exchange_kw(kind))
    stop_at = 3

    def stop(info):
        return info.iteration == stop_at

    pp.fit(_blocks(), G, 2, checkpoint_dir=tmp_path, checkpoint_every=every, callback=stop, **KW,
           **_exchange_kw(kind))
    newest = load_checkpoint(str(tmp_path))
    assert newest["done"] == stop_at  # every "every" iterations, and at the end
    resumed = pp.fit(_blocks(), G, 2, resume_from=tmp_path, **KW, **_exchange_kw(kind))
    assert torch.equal(resumed.X, full.X)
    assert all(torch.equal(x, y) for x, y in zip(resumed.Y, full.Y))
    assert resumed.history["nmse"] == full.history["nmse"]
    assert resumed.history["x_iters"] == full.history["x_iters"]


@pytest.mark.crypto
def test_paillier_run_resumes_with_new_keys_and_same_numbers(tmp_path, paillier_keypairs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = pp.fit(_blocks(), G, 2, **KW, **_exchange_kw("quantized"))
        pp.fit(_blocks(), G, 2, checkpoint_dir=tmp_path, callback=lambda i: i.iteration == 2, **KW,
               exchange="paillier", n_max=1e5, key_bits=128)
        resumed = pp.fit(_blocks(), G, 2, resume_from=tmp_path, **KW, exchange="paillier", n_max=1e5,
                         key_bits=128)
    assert torch.equal(resumed.X, full.X)
    assert resumed.history["nmse"] == full.history["nmse"]


def _stop_at(n):
    return lambda info: info.iteration == n


@pytest.mark.parametrize("every", [1, 2])
def test_resumed_run_continues_the_cost_counters(tmp_path, every):
    # cumulative counts, bytes (per edge too), the predicted seconds and the per-BCD
    # crypto_* history cover both segments, as in one uninterrupted run
    # (aggregated: the masked protocol's setup is counted once per segment, test_masked.py)
    kw = dict(KW, **_exchange_kw("quantized"), protocol="aggregated",
              exchange_options={"cost_model": FAKE_COSTS, "packing": True})
    full = pp.fit(_blocks(), G, 2, **kw)
    assert full.costs["encryptions"] > 0 and full.history["crypto_encryptions"][0] > 0
    pp.fit(_blocks(), G, 2, checkpoint_dir=tmp_path, checkpoint_every=every, callback=_stop_at(3), **kw)
    resumed = pp.fit(_blocks(), G, 2, resume_from=tmp_path, **kw)
    assert resumed.costs == full.costs
    crypto = [k for k in full.history if k.startswith("crypto_")]
    assert "crypto_ciphertext_bytes" in crypto and "crypto_estimated_seconds" in crypto
    assert {k: resumed.history[k] for k in crypto} == {k: full.history[k] for k in crypto}


@pytest.mark.crypto
def test_resumed_paillier_run_continues_the_measured_counters(tmp_path, paillier_keypairs):
    kw = dict(KW, exchange="paillier", n_max=1e5, key_bits=128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = pp.fit(_blocks(), G, 2, **kw, exchange_options={"keypairs": paillier_keypairs(128, 5)})
        pp.fit(_blocks(), G, 2, checkpoint_dir=tmp_path, callback=_stop_at(2), **kw)
        resumed = pp.fit(_blocks(), G, 2, resume_from=tmp_path, **kw)
    counts = ("encryptions", "decryptions", "homomorphic_additions", "scalar_multiplications", "ciphertext_bytes")
    assert {k: resumed.costs[k] for k in counts} == {k: full.costs[k] for k in counts}
    assert resumed.costs["bytes_per_edge"] == full.costs["bytes_per_edge"]
    assert resumed.history["crypto_encryptions"] == full.history["crypto_encryptions"]
    # both segments' measured times: at least the interrupted segment's keys and work
    assert resumed.costs["time_encrypt"] > resumed.history["crypto_time_encrypt"][1] > 0


def test_resume_refuses_a_different_run(tmp_path):
    pp.fit(_blocks(), G, 2, checkpoint_dir=tmp_path, **KW)
    with pytest.raises(CheckpointError, match=r"different run: .*its seeds is \[4\], this run's \[5\]"):
        pp.fit(_blocks(), G, 2, resume_from=tmp_path, **dict(KW, seed=5))
    with pytest.raises(CheckpointError, match=r"^resume_from: checkpoint .* different run: its mu is 0.1, this run's 0.2"):
        pp.fit(_blocks(), G, 2, resume_from=tmp_path, mu=0.2, **KW)
    with pytest.raises(CheckpointError, match=r"^bcd_iters: the checkpoint .* has done 6 BCD iterations, more than "
                                              r"bcd_iters = 4"):
        pp.fit(_blocks(), G, 2, resume_from=tmp_path, **dict(KW, bcd_iters=4))
    with pytest.raises(CheckpointError, match="neither a checkpoint file nor a folder"):
        pp.fit(_blocks(), G, 2, resume_from=tmp_path / "missing", **KW)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        pp.fit(_blocks(), G, 2, resume_from=tmp_path / "empty", **KW)


def test_ctrl_c_writes_a_checkpoint_and_resume_finishes_the_run(tmp_path):
    full = pp.fit(_blocks(), G, 2, **KW)

    def interrupt(info):
        if info.iteration == 4:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted) as err:
        pp.fit(_blocks(), G, 2, checkpoint_dir=tmp_path, checkpoint_every=0, callback=interrupt, **KW)
    assert err.value.done == 4 and os.path.exists(err.value.checkpoint)
    assert isinstance(err.value, KeyboardInterrupt)
    resumed = pp.fit(_blocks(), G, 2, resume_from=tmp_path, **KW)
    assert torch.equal(resumed.X, full.X) and resumed.history["nmse"] == full.history["nmse"]


def test_atomic_write_leaves_old_checkpoint_on_failure(tmp_path):
    path = tmp_path / "ckpt_bcd000001.pt"
    save_checkpoint(str(path), {"format": 1, "x": torch.ones(3)})
    before = path.read_bytes()

    class Boom:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(str(path), {"format": 1, "x": Boom()})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_torn_checkpoint_is_reported(tmp_path):
    (tmp_path / "ckpt_bcd000002.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"ckpt_bcd000002.pt' is damaged or not a checkpoint \(it cannot be read"):
        load_checkpoint(str(tmp_path))


def test_nan_keeps_the_last_good_checkpoint(tmp_path):
    with pytest.raises(pp.NumericalError):
        pp.fit(small_problem(counts=(3, 4, 3, 4)), graph.ring(4), 2, mu=1e-3, g_max=30.0, penalty="fixed",
               penalty_schedule="paper", exchange="plain",
               bcd_iters=60, x_iters=30, y_iters=5, device="cpu", checkpoint_dir=tmp_path)
    ck = load_checkpoint(str(tmp_path))
    assert ck["done"] >= 1
    assert all(torch.isfinite(v).all() for k, v in ck["state"].items() if v.is_floating_point())


@pytest.mark.crypto
def test_no_private_key_in_checkpoints_or_results(tmp_path, paillier_keypairs):
    pairs = paillier_keypairs(128, 5)
    secrets = set()
    for _, sk in pairs:
        secrets |= {str(sk.p), str(sk.q)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = pp.fit(_blocks(), G, 2, checkpoint_dir=tmp_path, **KW, exchange="paillier", n_max=1e5,
                     key_bits=128, exchange_options={"keypairs": pairs})
    torch.save({"X": res.X, "history": res.history}, tmp_path / "result.pt")
    blob = pickle.dumps({k: v for k, v in res.costs.items()})
    files = list(tmp_path.iterdir())
    assert files
    for f in files:
        data = f.read_bytes()
        for s in secrets:
            assert s.encode() not in data, f"{f.name} holds a private key factor"
    for s in secrets:
        assert s.encode() not in blob


def test_checkpoint_of_another_format_is_refused_by_name(tmp_path):
    from ppdnmf_torch.checkpoint import FORMAT_VERSION

    old = FORMAT_VERSION - 1
    save_checkpoint(str(tmp_path / "ckpt_bcd000001.pt"), {"format": old, "state": {}})
    with pytest.raises(CheckpointError, match=f"checkpoint format {old}.*bit for bit"):
        load_checkpoint(str(tmp_path))


def test_resume_of_a_checkpoint_without_cost_counters_keeps_rows_aligned(tmp_path):
    # a checkpoint of a run without the cost model holds no counters (and no crypto_* history):
    # the resumed run with the model pads the rows before its own segment
    from ppdnmf_torch.checkpoint import _run_hashes

    kw = dict(KW, **_exchange_kw("quantized"), exchange_options={"cost_model": FAKE_COSTS})
    pp.fit(_blocks(), G, 2, checkpoint_dir=tmp_path / "ck", callback=_stop_at(3), **kw)
    newest = load_checkpoint(str(tmp_path / "ck"))
    old = {k: v for k, v in newest.items() if k != "path"}
    old["ledgers"] = {"exchange": {}}
    old["history"] = {k: v for k, v in old["history"].items() if not k.startswith("crypto_")}
    old["hashes"] = _run_hashes(old)
    (tmp_path / "old").mkdir()
    save_checkpoint(str(tmp_path / "old" / "ckpt_bcd000003.pt"), old)
    resumed = pp.fit(_blocks(), G, 2, resume_from=tmp_path / "old", **kw)
    enc = resumed.history["crypto_encryptions"]
    assert len(enc) == len(resumed.history["nmse"]) == 6
    assert all(v != v for v in enc[:3]) and all(v > 0 for v in enc[3:])


# -- the history's packing (issue 31, item 2: a write's cost does not grow with the run) -----


class _CountedFloat(float):
    """A float that counts how often a checkpoint converts it."""

    calls = 0

    def __float__(self):
        type(self).calls += 1
        return float.__float__(self)


def test_history_packer_packs_only_the_new_entries():
    from ppdnmf_torch.checkpoint import HistoryPacker, unpack_history

    packer, history = HistoryPacker(), {"nmse": [], "per_trial": []}
    for n in range(1, 301):
        history["nmse"].append(_CountedFloat(1.0 / n))
        history["per_trial"].append(torch.full((2,), float(n), dtype=torch.float64))
        if n % 10 == 0:
            packed = packer.pack(history, {k: n for k in history})
    # each entry converted once over 30 writes (a full repack each write would make 4,650)
    assert _CountedFloat.calls == 300
    assert set(packed["nmse"]) == {"floats"} and packed["nmse"]["floats"].shape == (300,)
    assert packed["per_trial"]["stack"].shape == (300, 2)
    back = unpack_history(packed)
    assert back["nmse"] == [1.0 / n for n in range(1, 301)]
    assert all(torch.equal(a, b) for a, b in zip(back["per_trial"], history["per_trial"]))


def test_history_packer_keeps_mixed_entries_as_lists():
    from ppdnmf_torch.checkpoint import HistoryPacker, unpack_history

    history = {"odd": [1.0, torch.ones(2), 3.0]}
    packed = HistoryPacker().pack(history, {"odd": 3})
    assert isinstance(packed["odd"], list)
    back = unpack_history(packed)
    assert back["odd"][0] == 1.0 and torch.equal(back["odd"][1], torch.ones(2))


def test_checkpoint_history_is_one_tensor_per_key(tmp_path):
    pp.fit(_blocks(), G, 2, checkpoint_dir=tmp_path / "ck", callback=_stop_at(3), **KW)
    payload = load_checkpoint(str(tmp_path / "ck"))
    assert payload["format"] == 5 and payload["model"] == "ppdnmf"
    for key, vals in payload["history"].items():
        assert isinstance(vals, dict) and len(vals) == 1, key
        assert next(iter(vals.values())).shape[0] == 3, key
