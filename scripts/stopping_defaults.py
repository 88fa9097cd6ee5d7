#!/usr/bin/env python
"""The library's stopping defaults on the README's example (docs/RESULTS.md, "Stopping by
default"): the default rule (``tol=1e-4``, ADMM loops at fixed counts), the same with the ADMM
loops on the tolerance, the old fixed 100 iterations, and the README's estimator example::

    python scripts/stopping_defaults.py
"""
import time, warnings
import ppdnmf_torch as pp
d = pp.data.synthetic(seed=0)
for label, kw in (("default (tol=1e-4, admm_tol=0)", {}), ("tol=1e-4 with admm_tol=None (ADMM loops on tol)", {"admm_tol": None}),
                  ("fixed 100 iterations (tol=0)", {"tol": 0.0, "bcd_iters": 100})):
    t = time.time()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = pp.fit(d.Z, pp.graph.ring(10), 5, negative="allow", seed=0, **kw)
    print(f"{label}: {r.n_iter} BCD iterations, converged {r.converged}, NMSE {r.nmse:.6f}, consensus {r.consensus:.2e}, {time.time()-t:.0f} s, warnings {[type(x.message).__name__ for x in w]}")
X, X_new = d.Z.T[:180].numpy(), d.Z.T[180:].numpy()
t = time.time()
m = pp.PPDNMF(n_components=5, graph=pp.graph.ring(10), random_state=0, negative="allow")
W = m.fit_transform(X)
print(f"README example: n_iter_ {m.n_iter_}, nmse_ {m.nmse_:.6f}, consensus_ {m.consensus_:.2e}, {time.time()-t:.0f} s")
