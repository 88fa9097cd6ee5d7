#!/usr/bin/env python
"""Fingerprint the models beside PPDNMF's single-process fit: symmetric NMF across agents (one
process and over ranks), FSSPCA with a server and serverless, and PPDNMF's run over ranks.

``scripts/fingerprint.py`` covers PPDNMF's ``fit``; ``scripts/fingerprint_symnmf.py`` the centralized
symmetric-NMF solvers; this script the rest, so that a restructure of the loops they share changes
no bit::

    python scripts/fingerprint_models.py --json before.json     # before the change
    python scripts/fingerprint_models.py --check before.json    # after it: exit 1 on any difference
    python scripts/fingerprint_models.py --only fsspca          # the runs whose names start so

Every tensor of each result and every history key is hashed, but measured quantities (wall times,
seconds); byte and operation counters are hashed (they follow from the settings). The runs go
through the public functions, so the script works across refactors: a function that moves changes
its import here, never a run's settings.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import warnings

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # BLAS splits its sums by thread count
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ppdnmf_torch as pp  # noqa: E402
from ppdnmf_torch.distributed import Comm, free_port, launch_local  # noqa: E402
from ppdnmf_torch.graph import random_connected, ring  # noqa: E402
from ppdnmf_torch.models.fsspca import fit_fsspca  # noqa: E402
from ppdnmf_torch.models.fsspca.serverless import fit_serverless  # noqa: E402
from ppdnmf_torch.models.ppdnmf.distributed import fit_rank  # noqa: E402
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents  # noqa: E402
from ppdnmf_torch.models.symnmf.distributed import fit_symnmf_rank  # noqa: E402


def _measured(key: str) -> bool:
    return "time" in key or "seconds" in key or key.endswith("_s")


def _update(h, value) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        h.update(str((a.shape, str(a.dtype))).encode())
        h.update(a.tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            if isinstance(k, str) and _measured(k):
                continue
            h.update(str(k).encode())
            _update(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"[{len(value)}".encode())
        for v in value:
            _update(h, v)
        h.update(b"]")
    elif isinstance(value, float):
        h.update(np.float64(value).tobytes())
    elif value is None or isinstance(value, (bool, int, str)):
        h.update(repr(value).encode())
    else:  # a nested result object
        _update(h, {k: v for k, v in vars(value).items()})


def digest(result, fields) -> dict:
    out = {}
    for name in fields:
        h = hashlib.sha256()
        _update(h, getattr(result, name))
        out[name] = h.hexdigest()[:16]
    return out


# ------------------------------------------------------------------------------ symmetric NMF
def _similarity(n=30, r=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    W = torch.rand((n, r), generator=gen, dtype=torch.float64)
    X = W @ W.T + 0.01 * torch.rand((n, n), generator=gen, dtype=torch.float64)
    X = (X + X.T) / 2
    return X / torch.linalg.matrix_norm(X, ord=2)


# exchange="plain" and aggregation="plain" pinned below: the references were taken when they were the
# defaults (the secure sum, secagg, is the default since)
SYM = dict(n_agents=5, max_iter=6, x_iters=3, seed=1, start_seed=1, device="cpu", exchange="plain")
SYM_FIELDS = ("U", "V", "U_agents", "lam", "history", "n_iter", "parts", "costs", "converged")


def _sym(**kw):
    X = kw.pop("X", None)
    X = _similarity() if X is None else X
    return fit_symnmf_agents(X, 3, **dict(SYM, **kw))


def _sym_sparse():
    X = _similarity()
    return _sym(X=sp.csr_matrix((X * (X > X.median())).numpy()))


def _sym_resumed():
    with tempfile.TemporaryDirectory() as tmp:
        _sym(max_iter=3, checkpoint_dir=tmp, checkpoint_every=1)
        return _sym(checkpoint_dir=tmp, checkpoint_every=2, resume=True)


def _sym_rank(**kw):
    comm = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=60, heartbeat=None)
    try:
        kw = dict(SYM, **kw)
        kw.pop("device")
        return fit_symnmf_rank(comm, _similarity(), 3, **kw).result
    finally:
        comm.close()


def _sym_ranks_main(kw):
    with Comm.connect("env://", timeout=120) as comm:
        return fit_symnmf_rank(comm, _similarity(), 3, **kw).result


def _sym_two_ranks():
    kw = dict(SYM)
    kw.pop("device")
    outs = launch_local(2, _sym_ranks_main, (kw,), timeout=300, grace=30)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return outs[0].value


# ------------------------------------------------------------------------------ FSSPCA
def _blocks(K=4, n=(20, 30, 25, 15), d=8, seed=0, spike=True):
    rng = np.random.default_rng(seed)
    v = np.zeros(d)
    v[:3] = 1 / np.sqrt(3)
    out = []
    for k in range(K):
        A = rng.standard_normal((n[k % len(n)], d))
        if spike:
            A += 3.0 * rng.standard_normal((A.shape[0], 1)) * v
        out.append(A)
    return out


# the runs made before the polar local step became the default pin the Riemannian one (their hashes)
FS = dict(alpha=2.0, max_iter=40, tol=0.0, seed=3, local_solver="riemannian", aggregation="plain")
FS_FIELDS = ("z", "components", "w", "u", "n_iter", "converged", "history", "mean", "explained_variance",
             "variance_components", "total_variance", "costs")
SL_FIELDS = ("z", "z_mean", "components", "w", "u", "n_iter", "converged", "disagreement", "consensus",
             "exchange_calls", "bytes", "costs", "mean_error")


def _fs(**kw):
    return fit_fsspca(_blocks(), 2, **dict(FS, **kw))


def _fs_resumed():
    with tempfile.TemporaryDirectory() as tmp:
        def stop(info):
            return info.iteration == 17
        _fs(checkpoint_dir=tmp, checkpoint_every=5, callback=stop)
        return _fs(checkpoint_dir=tmp, checkpoint_every=5, resume=True)


def _sl(**kw):
    graph = kw.pop("graph", None) or ring(4)
    base = {k: v for k, v in FS.items() if k != "aggregation"}
    return fit_serverless(_blocks(), 2, graph, **dict(dict(base, max_iter=25, exchange="plain"), **kw))


# ------------------------------------------------------------------------------ PPDNMF over ranks
PAPER = dict(penalty_schedule="paper", init="ones", y_solver="admm")
# fit_rank's defaults when the reference was taken, pinned (its defaults are fit's since)
RANK_KW = dict(mu=0.1, eta=1.0, g_max=0.033, negative="allow", bcd_iters=5, x_iters=6, y_iters=6, tol=0.0,
               penalty_schedule="paper", init="ones", exchange="plain")
FIT_FIELDS = ("X", "Y", "U", "history", "n_iter")


def _synthetic():
    d = pp.data.synthetic(seed=0)
    g = random_connected(10, avg_degree=3.0, seed=0)
    cols = pp.data.split_counts(200, 10, lo=4, hi=40, seed=0)
    return d.Z, g, cols


def _rank_solo(**kw):
    Z, g, cols = _synthetic()
    comm = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=60, heartbeat=None)
    try:
        return fit_rank(comm, Z, g, 5, columns=cols, **dict(RANK_KW, **kw)).result
    finally:
        comm.close()


def _ppdnmf_ranks_main(kw):
    Z, g, cols = _synthetic()
    with Comm.connect("env://", timeout=120) as comm:
        return fit_rank(comm, Z, g, 5, columns=cols, **kw).result


def _rank_two(**kw):
    outs = launch_local(2, _ppdnmf_ranks_main, (dict(RANK_KW, **kw),), timeout=300, grace=30)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return outs[0].value


CONFIGS = {
    # symmetric NMF across agents
    "symnmf_agents/default": (lambda: _sym(), SYM_FIELDS),
    "symnmf_agents/quantized": (lambda: _sym(exchange="quantized", exchange_options={"n_max": 1e4}), SYM_FIELDS),
    "symnmf_agents/paillier128": (lambda: _sym(exchange="paillier", exchange_options={"n_max": 1e4, "key_bits": 128},
                                               max_iter=2, x_iters=2), SYM_FIELDS[:-2] + ("converged",)),
    "symnmf_agents/paper_caps": (lambda: _sym(penalty_schedule="paper", g_cap=[0.2, 0.3, 0.25, 0.3, 0.1]),
                                 SYM_FIELDS),
    "symnmf_agents/fixed_penalty": (lambda: _sym(penalty=0.5, penalty_mode="fixed"), SYM_FIELDS),
    "symnmf_agents/common_start_mu": (lambda: _sym(start="common", mu=1.0, y_iters=2), SYM_FIELDS),
    "symnmf_agents/sparse": (_sym_sparse, SYM_FIELDS),
    "symnmf_agents/tol_trials": (lambda: _sym(tol=1e-3, max_iter=30, trials=2), SYM_FIELDS),
    "symnmf_agents/resumed": (_sym_resumed, SYM_FIELDS),
    "symnmf_rank/solo": (lambda: _sym_rank(), SYM_FIELDS[:-2] + ("converged",)),
    "symnmf_rank/solo_quantized": (lambda: _sym_rank(exchange="quantized", exchange_options={"n_max": 1e4},
                                                     aggregation="plain"), SYM_FIELDS[:-2] + ("converged",)),
    "symnmf_rank/two": (_sym_two_ranks, SYM_FIELDS[:-2] + ("converged",)),
    # FSSPCA with a server
    "fsspca/default": (lambda: _fs(), FS_FIELDS),
    "fsspca/quantized": (lambda: _fs(aggregation="quantized"), FS_FIELDS),
    "fsspca/paillier128": (lambda: _fs(aggregation="paillier", aggregation_options={"key_bits": 128},
                                       max_iter=5), FS_FIELDS[:-1]),
    "fsspca/rho_worker_pca": (lambda: _fs(rho="worker", init="pca"), FS_FIELDS),
    "fsspca/smoothing_huber_wolfe": (lambda: _fs(smoothing="huber", line_search="wolfe", lambda_2=0.1), FS_FIELDS),
    "fsspca/trials_tol": (lambda: _fs(trials=3, alpha=[0.5, 2.0, 4.0], tol=1e-6, max_iter=200), FS_FIELDS),
    "fsspca/no_center_float32": (lambda: fit_fsspca([b.astype(np.float32) for b in _blocks()], 2,
                                                    **dict(FS, center=False)), FS_FIELDS),
    "fsspca/resumed": (_fs_resumed, FS_FIELDS),
    # the polar runs pin the torch plan (their hashes predate the host plan, the CPU default since)
    "fsspca/polar": (lambda: _fs(local_solver="polar", plan="torch"), FS_FIELDS),
    "fsspca/polar_trials_rho_worker": (lambda: _fs(local_solver="polar", trials=3, alpha=[0.0, 2.0, 4.0],
                                                   rho="worker", tol=1e-6, max_iter=200, plan="torch"), FS_FIELDS),
    # the host plan (the CPU default of the polar solver): the same runs, and one worker (its 2-D path)
    "fsspca/polar_host": (lambda: _fs(local_solver="polar", plan="host"), FS_FIELDS),
    "fsspca/polar_trials_rho_worker_host": (lambda: _fs(local_solver="polar", trials=3, alpha=[0.0, 2.0, 4.0],
                                                        rho="worker", tol=1e-6, max_iter=200, plan="host"), FS_FIELDS),
    "fsspca/polar_one_worker_host": (lambda: fit_fsspca(_blocks()[:1], 2, **dict(FS, local_solver="polar", plan="host",
                                                                                  aggregation="plain")), FS_FIELDS),
    # FSSPCA serverless
    "fsspca_serverless/laplacian": (lambda: _sl(), SL_FIELDS),
    "fsspca_serverless/admm": (lambda: _sl(consensus="admm", graph=random_connected(4, 2.0, seed=1)), SL_FIELDS),
    "fsspca_serverless/quantized": (lambda: _sl(exchange="quantized", exchange_options={"n_max": 1e6}), SL_FIELDS),
    "fsspca_serverless/tol_no_center": (lambda: _sl(tol=1e-4, center=False, max_iter=60), SL_FIELDS),
    "fsspca_serverless/polar": (lambda: _sl(local_solver="polar"), SL_FIELDS),
    # PPDNMF over ranks
    "ppdnmf_rank/solo_paper": (lambda: _rank_solo(**PAPER), FIT_FIELDS),
    "ppdnmf_rank/solo_quantized": (lambda: _rank_solo(exchange="quantized", n_max=1e4, **PAPER), FIT_FIELDS),
    "ppdnmf_rank/solo_defaults_tol": (lambda: _rank_solo(tol=1e-3, bcd_iters=12), FIT_FIELDS),
    "ppdnmf_rank/two_paper": (lambda: _rank_two(**PAPER), FIT_FIELDS),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the hashes to this file")
    ap.add_argument("--check", help="compare with the hashes in this file; exit 1 on a difference")
    ap.add_argument("--only", nargs="*", help="run only the configurations whose names start with these")
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    configs = CONFIGS
    if args.only:
        configs = {k: v for k, v in CONFIGS.items() if any(k.startswith(p) for p in args.only)}
    hashes = {}
    for name, (fn, fields) in configs.items():
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hashes[name] = digest(fn(), fields)
        print(f"{name:36s} " + " ".join(f"{k} {v}" for k, v in hashes[name].items())
              + f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(hashes, fh, indent=2, sort_keys=True)
    if args.check:
        with open(args.check, encoding="utf-8") as fh:
            ref = json.load(fh)
        diff = [k for k in hashes if k in ref and hashes[k] != ref[k]]
        for k in diff:
            fields = [f for f in ref[k] if ref[k][f] != hashes[k].get(f)]
            print(f"DIFFERS: {k}: {fields}")
        missing = [k for k in hashes if k not in ref]
        for k in missing:
            print(f"not in {args.check}: {k}")
        print("identical" if not diff else f"{len(diff)} of {len(hashes)} differ")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
