#!/usr/bin/env python
"""Fingerprint the solver's numbers: a hash of ``X``, ``Y``, ``U`` and every history key of
a fixed set of runs.

A restructure changes no bit: run this before moving code and after, and compare::

    python scripts/fingerprint.py --json before.json          # before the change
    python scripts/fingerprint.py --check before.json         # after it: exit 1 on any difference
    python scripts/fingerprint.py --quick                     # without the N = 2000 run

The runs go through the public API only (``fit``, ``fit_trials``, ``fit_centralized``,
``run_experiment``), so the script works across refactors. Measured quantities (step
times, the exchange's timers, estimated seconds) are left out of the hashes: they differ
from run to run. Everything else in the history is hashed, in key order.

Configurations: both consensus forms; ``plain``, ``quantized`` and ``paillier`` (128-bit
keys, the printed protocols, fast and naive host paths; pinned to ``protocol="aggregated"``
where they ran with the default before ``masked`` became it); eager and ``fuse=True`` (whole
iterations and buffered chains); a stopping rule; batched trials; resume from a
checkpoint after Ctrl-C; the centralized baseline; and N = 2000 agents with CBCL sizes
(L = 361, K = 49, about 243 columns each) for one BCD iteration of 2 + 2 ADMM iterations.
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

# BLAS splits its sums by thread count, so the hashes hold for one count: the baseline's two
# (set before torch starts; an explicit OMP_NUM_THREADS wins, and the package then keeps it)
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ppdnmf_torch as pp  # noqa: E402


def _is_measured(key: str) -> bool:
    return "time" in key or "seconds" in key


#: history keys added after the reference hashes were first taken: hashed on their own
#: (``added``), so that a reference written before them still checks the older keys
ADDED_KEYS = ("nmse_worst",)


def _update(h, value) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.numpy().tobytes())
    elif isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        h.update(str((a.shape, str(a.dtype))).encode())
        h.update(a.tobytes())
    elif isinstance(value, (list, tuple)):
        h.update(f"[{len(value)}".encode())
        for v in value:
            _update(h, v)
        h.update(b"]")
    elif isinstance(value, float):
        h.update(np.float64(value).tobytes())
    else:
        h.update(repr(value).encode())


def digest(result) -> dict:
    """``{"X": hex, "Y": hex, "U": hex, "history": hex}`` of a FitResult or TrialsResult."""
    out = {}
    for name in ("X", "Y", "U"):
        h = hashlib.sha256()
        _update(h, getattr(result, name))
        out[name] = h.hexdigest()[:16]
    h, added = hashlib.sha256(), hashlib.sha256()
    for key in sorted(result.history):
        if _is_measured(key):
            continue
        target = added if key in ADDED_KEYS else h
        target.update(key.encode())
        _update(target, result.history[key])
    out["history"] = h.hexdigest()[:16]
    out["n_iter"] = int(result.n_iter)
    out["added"] = added.hexdigest()[:16]
    return out


def _synthetic(seed=0, N=10):
    d = pp.data.synthetic(seed=seed)
    g = pp.graph.random_connected(N, avg_degree=3.0, seed=seed)
    cols = pp.data.split_counts(200, N, lo=4, hi=40, seed=seed)
    return d.Z, g, cols


def _cbcl_sizes(N, seed=0, L=361, cols=243):
    gen = torch.Generator().manual_seed(seed)
    counts = [cols + (i % 3) - 1 for i in range(N)]
    blocks = [torch.rand((L, c), generator=gen, dtype=torch.float64) for c in counts]
    return blocks, pp.graph.random_connected(N, 3.0, seed=seed)


#: the paper's caps, start and Y-step, pinned in every run (the library's defaults differ)
# exchange="plain" pinned: the reference was taken when it was the default (the default is secagg since)
PAPER = dict(penalty_schedule="paper", init="ones", y_solver="admm")
SYN = dict(rank=5, mu=0.1, eta=1.0, g_max=0.033, negative="allow", device="cpu", exchange="plain", **PAPER)


def _fit_syn(**kw):
    Z, g, cols = _synthetic()
    args = dict(SYN, bcd_iters=6, x_iters=10, y_iters=10)
    args.update(kw)
    return pp.fit(Z, g, columns=cols, **args)


def _resumed():
    Z, g, cols = _synthetic()
    kw = dict(SYN, bcd_iters=6, x_iters=10, y_iters=10, exchange="quantized", protocol="aggregated", n_max=1e5)

    def stop_at_3(info):
        if info.iteration == 3:
            raise KeyboardInterrupt
        return False

    with tempfile.TemporaryDirectory() as tmp:
        try:
            pp.fit(Z, g, columns=cols, checkpoint_dir=tmp, checkpoint_every=2, callback=stop_at_3, **kw)
        except KeyboardInterrupt:
            pass
        else:  # pragma: no cover - the callback always interrupts
            raise RuntimeError("the interrupted run did not stop")
        return pp.fit(Z, g, columns=cols, checkpoint_dir=tmp, checkpoint_every=2, resume_from=tmp, **kw)


def _large(**kw):
    blocks, g = _cbcl_sizes(24)
    args = dict(mu=2.0, eta=2.0, g_max=0.05, bcd_iters=2, x_iters=4, y_iters=4, device="cpu", exchange="plain",
                **PAPER)
    args.update(kw)
    return pp.fit(blocks, g, 49, **args)


def _n2000():
    blocks, g = _cbcl_sizes(2000)
    return pp.fit(blocks, g, 49, mu=2.0, eta=2.0, g_max=0.05, bcd_iters=1, x_iters=2, y_iters=2, device="cpu",
                  exchange="plain", **PAPER)


def _trials():
    res = pp.run_experiment("paper_synthetic", trials=3, seed=0, bcd_iters=4, x_iters=8, y_iters=8,
                            exchange="quantized", protocol="aggregated", n_max=1e4, device="cpu", **PAPER)
    return res.distributed, res.centralized


CONFIGS = {
    "plain_derived": lambda: _fit_syn(),
    "plain_paper_literal": lambda: _fit_syn(consensus_form="paper_literal"),
    "plain_fixed_penalty": lambda: _fit_syn(penalty="fixed"),
    "quantized_aggregated": lambda: _fit_syn(exchange="quantized", protocol="aggregated", n_max=1e4),
    "quantized_paper": lambda: _fit_syn(exchange="quantized", protocol="paper", n_max=1e6),
    "quantized_float32": lambda: _fit_syn(exchange="quantized", protocol="aggregated", n_max=1e4,
                                          dtype=torch.float32),
    "paillier128_aggregated": lambda: _fit_syn(exchange="paillier", protocol="aggregated", key_bits=128, n_max=1e4,
                                               bcd_iters=2, x_iters=3, y_iters=3),
    "paillier128_paper": lambda: _fit_syn(exchange="paillier", protocol="paper", key_bits=128, n_max=1e4,
                                          bcd_iters=2, x_iters=3, y_iters=3),
    "paillier128_naive": lambda: _fit_syn(exchange="paillier", protocol="aggregated", key_bits=128, n_max=1e4,
                                          bcd_iters=1, x_iters=2, y_iters=2, exchange_options={"fast": False}),
    # the masked protocol: X, Y and U equal the aggregated runs' above bit for bit
    "quantized_masked": lambda: _fit_syn(exchange="quantized", protocol="masked", n_max=1e4),
    "paillier128_masked": lambda: _fit_syn(exchange="paillier", protocol="masked", key_bits=128, n_max=1e4,
                                           bcd_iters=2, x_iters=3, y_iters=3),
    "quantized_like_paillier128": lambda: _fit_syn(exchange="quantized", protocol="aggregated", key_bits=128,
                                                   n_max=1e4, bcd_iters=2, x_iters=3, y_iters=3),
    "stopping_rule": lambda: _fit_syn(tol=1e-3, admm_tol=None, bcd_iters=30),
    "stopping_rule_admm": lambda: _fit_syn(tol=1e-4, admm_tol=1e-2, bcd_iters=8, exchange="quantized",
                                           protocol="aggregated"),
    "fused_small_plain": lambda: _fit_syn(fuse=True),
    "fused_small_quantized": lambda: _fit_syn(fuse=True, exchange="quantized", protocol="aggregated", n_max=1e4),
    "fused_large_plain": lambda: _large(fuse=True),
    "fused_large_quantized": lambda: _large(fuse=True, exchange="quantized", protocol="aggregated", n_max=1e4),
    "fused_large_stopping_rule": lambda: _large(fuse=True, tol=1e-4, admm_tol=None, bcd_iters=3),
    "eager_large_stopping_rule": lambda: _large(tol=1e-4, admm_tol=None, bcd_iters=3),
    "resume_from_checkpoint": _resumed,
    "centralized": lambda: pp.fit_centralized(_synthetic()[0], 5, negative="allow", bcd_iters=6, x_iters=10,
                                              y_iters=10, device="cpu", **PAPER),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the hashes to this file")
    ap.add_argument("--check", help="compare with the hashes in this file; exit 1 on a difference")
    ap.add_argument("--quick", action="store_true", help="leave out the N = 2000 run")
    ap.add_argument("--only", nargs="*", help="run only these configurations")
    args = ap.parse_args(argv)
    configs = dict(CONFIGS)
    configs["trials"] = None  # two results: distributed and centralized
    if not args.quick:
        configs["n2000_cbcl_sizes"] = _n2000
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only}
    hashes = {}
    for name, fn in configs.items():
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if name == "trials":
                dist, cent = _trials()
                hashes["trials_distributed"] = digest(dist)
                hashes["trials_centralized"] = digest(cent)
                shown = ("trials_distributed", "trials_centralized")
            else:
                hashes[name] = digest(fn())
                shown = (name,)
        for k in shown:
            h = hashes[k]
            print(f"{k:28s} X {h['X']}  Y {h['Y']}  U {h['U']}  history {h['history']}  n_iter {h['n_iter']}"
                  f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(hashes, fh, indent=2, sort_keys=True)
    if args.check:
        with open(args.check, encoding="utf-8") as fh:
            ref = json.load(fh)
        # a reference taken before a field existed checks the fields it has
        diff = [k for k in hashes if k in ref and any(hashes[k].get(f) != v for f, v in ref[k].items())]
        missing = [k for k in hashes if k not in ref]
        for k in diff:
            print(f"DIFFERS: {k}: {ref[k]} -> {hashes[k]}")
        for k in missing:
            print(f"not in {args.check}: {k}")
        print("identical" if not diff else f"{len(diff)} of {len(hashes)} differ")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
