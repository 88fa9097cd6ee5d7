#!/usr/bin/env python
"""Fingerprint the symmetric-NMF solvers: a hash of ``U``, ``V``, ``lambda`` and every
history key but the wall time, for a fixed set of ``fit_symnmf`` runs.

A speed-up that must change no bit: run this before and after::

    OMP_NUM_THREADS=1 python scripts/fingerprint_symnmf.py --json before.json
    OMP_NUM_THREADS=1 python scripts/fingerprint_symnmf.py --check before.json   # exit 1 on a difference

Runs: every method, one trial and three batched, dense and sparse ``X``, float64 and
float32, a tolerance that freezes trials at different iterations, A-SymHALS's inner loop; on the
torch plan (``fit_symnmf(plan="torch")``, the bits of the reference hashes; ``--plan host``: the
host plan's runs, the methods it takes, keys ``host/...``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")  # BLAS splits its sums by thread count

import scipy.sparse as sp  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's package, not an installed one

from ppdnmf_torch.models.symnmf import fit_symnmf, initial_factor, synthetic_similarity  # noqa: E402
from ppdnmf_torch.models.symnmf.fit import METHODS  # noqa: E402
from ppdnmf_torch.models.symnmf.host import HOST_METHODS  # noqa: E402


def _hash(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()[:16]


def runs(plan="torch"):
    X, _ = synthetic_similarity(40, 4, 0.1, seed=3)
    X = X[0]
    Xs = sp.csr_matrix(torch.where(X > 0.6 * X.mean(), X, torch.zeros_like(X)).numpy())
    U0 = initial_factor(40, 4, trials=3, seed=5)
    for method in METHODS if plan == "torch" else HOST_METHODS:
        for name, data, kw in (("dense1", X, dict(U0=U0[:1])),
                               ("dense3", X, dict(U0=U0)),
                               ("sparse3", Xs, dict(U0=U0)),
                               ("f32", X.float(), dict(U0=U0.float(), dtype=torch.float32)),
                               ("tol", X, dict(U0=U0, tol=1e-4))):
            kw = {"max_iter": 25, "tol": 0, **kw}
            if method in ("symhals", "a_symhals", "symanls") and name != "tol":
                kw["lam0"] = 0.5
            key = f"{method}/{name}" if plan == "torch" else f"host/{method}/{name}"
            yield key, lambda m=method, d=data, k=kw: fit_symnmf(d, 4, method=m, device="cpu", plan=plan, **k)


def fingerprint(plan="torch") -> dict:
    out = {}
    warnings.simplefilter("ignore")
    for key, fit in runs(plan):
        res = fit()
        hist = [res.history[k] for k in sorted(res.history) if k != "time"]
        out[key] = _hash(res.U, res.V, res.lam, res.n_iter, *hist)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the hashes here")
    ap.add_argument("--check", help="compare with the hashes in this file; exit 1 on any difference")
    ap.add_argument("--plan", choices=["torch", "host"], default="torch", help="fit_symnmf's plan (default torch)")
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    fp = fingerprint(args.plan)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(fp, f, indent=1, sort_keys=True)
    if args.check:
        with open(args.check) as f:
            ref = json.load(f)
        bad = sorted(k for k in ref.keys() | fp.keys() if ref.get(k) != fp.get(k))
        print(f"{len(fp) - len(bad)} of {len(fp)} runs identical" + (f"; differ: {bad}" if bad else ""))
        return 1 if bad else 0
    print(json.dumps(fp, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
