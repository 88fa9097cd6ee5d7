#!/usr/bin/env python
"""Time one checkpoint write against the run's length (issue 31, item 2), side by side in
one process: the format-3 history (Python lists of small tensors, every entry pickled at
every write) against the packed one (:class:`~ppdnmf_torch.checkpoint.HistoryPacker`: one
tensor per key, only the new entries packed at each write).

The state and history have the default run's shapes (10 agents, L = 30, K = 5, 13 history
keys: floats and per-trial tensors). Each ``N`` simulates a run that writes every 10 BCD
iterations up to ``N`` and reports the mean time of its last writes and the total::

    python scripts/bench_checkpoint.py --lengths 250 500 1000 2000 4000 --lists-up-to 1000
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from ppdnmf_torch.checkpoint import HistoryPacker, _content_hashes, save_checkpoint


def _payload(state, hist, packer):
    lengths = {k: len(v) for k, v in hist.items()}
    if packer is None:  # format 3: every entry copied and pickled on its own
        h = {k: [v.detach().cpu().clone() if isinstance(v, torch.Tensor) else float(v) for v in vals]
             for k, vals in hist.items()}
    else:
        h = packer.pack(hist, lengths)
    payload = {"format": 4, "bcd_done": lengths["nmse"], "state": {k: v.clone() for k, v in state.items()},
               "sampler": {}, "history": h, "exchange_costs": {}, "fingerprint": ""}
    payload["hashes"] = _content_hashes(payload)
    return payload


def run(n_iters: int, packed: bool, folder: str, every: int = 10):
    state = {k: torch.rand(1, 10, 30, 5, dtype=torch.float64) for k in ("X", "U", "P", "Q", "Q_prev")}
    state.update({k: torch.rand(1, 10, 5, 40, dtype=torch.float64) for k in ("Y", "V", "R")})
    hist: dict = {}
    packer = HistoryPacker() if packed else None
    times = []
    for n in range(1, n_iters + 1):
        for k in ("nmse", "consensus", "nmse_worst", "objective", "x_primal", "x_dual", "y_primal", "y_dual"):
            hist.setdefault(k, []).append(torch.rand(1, dtype=torch.float64))
        for k in ("x_iters", "y_iters"):
            hist.setdefault(k, []).append(torch.full((1, 10), 30, dtype=torch.int64))
        for k in ("time_x", "time_y", "time_metrics"):
            hist.setdefault(k, []).append(0.01 * n)
        if n % every == 0:
            t0 = time.perf_counter()
            save_checkpoint(os.path.join(folder, "ckpt.pt"), _payload(state, hist, packer))
            times.append(time.perf_counter() - t0)
    return sum(times[-5:]) / 5, sum(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[250, 500, 1000, 2000, 4000])
    ap.add_argument("--lists-up-to", type=int, default=1000,
                    help="time the format-3 lists only up to this length (their total grows with its square)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        print(f"{'N':>6} {'lists: last write':>18} {'total':>9} {'packed: last write':>19} {'total':>9} {'ratio':>7}")
        for n in args.lengths:
            pw, pt = run(n, True, folder)
            if n > args.lists_up_to:
                print(f"{n:>6} {'-':>18} {'-':>9} {pw * 1e3:>16.1f} ms {pt:>7.2f} s {'-':>7}")
                continue
            lw, lt = run(n, False, folder)
            print(f"{n:>6} {lw * 1e3:>15.1f} ms {lt:>7.2f} s {pw * 1e3:>16.1f} ms {pt:>7.2f} s {lt / pt:>6.1f}x")


if __name__ == "__main__":
    main()
