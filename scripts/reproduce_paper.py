#!/usr/bin/env python
"""Reproduce Section IV (Fig. 1) of the PPDNMF paper (arXiv 2403.18326).

What it writes under ``<out>`` (default ``outputs/paper/<timestamp>/`` in the repository):

* ``fig1a_synthetic_nmse.png``  NMSE vs BCD iteration, mean over trials, one curve per
  ``N_max`` (``exchange="quantized"``) and the centralized baseline, log-scale y.
* ``fig1b_cbcl_nmse.png``       the same on MIT-CBCL (skipped when the data file is missing).
* ``fig1c_cbcl_faces.png``      faces #1 and #2429, original next to the agent's
  reconstruction ``X_i Y_i`` (trial 0, largest ``N_max``, 1e6 by default).
* ``consensus_synthetic.png``, ``consensus_cbcl.png``  consensus error vs BCD iteration.
* one CSV per figure with every plotted number (iteration, mean and std per curve;
  pixel values for the faces), ``summary.json`` and ``summary.md`` (final NMSE mean +- std,
  final consensus error, wall times, machine), an optional Paillier confirmation, and
  TensorBoard logs under ``<out>/tb``.

The PNGs are also copied to ``docs/figures/`` (``--figures-dir``, ``--no-copy-figures``).

Example (the run recorded in docs/RESULTS.md is printed in its summary.md)::

    python scripts/reproduce_paper.py --trials-synthetic 100 --trials-cbcl 4 --threads 1 --paillier-trials 2
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import shlex
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
PAPER_NMAX = (10.0, 1e2, 1e3, 1e4, 1e5, 1e6)
#: the paper's key size; the quantized sweep uses it too, so the integer codec checks
#: the same range the paper's Paillier stage has
PAPER_KEY_BITS = 128
FACES = (1, 2429)  # 1-based face numbers, as in the paper


# ----------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------


def _float_list(text: str) -> list[float]:
    out = []
    for part in text.replace(",", " ").split():
        v = float(part)
        if not math.isfinite(v) or v < 1:
            raise argparse.ArgumentTypeError(f"N_max values must be finite and >= 1, got {part!r}")
        out.append(v)
    if not out:
        raise argparse.ArgumentTypeError("need at least one N_max value")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="reproduce_paper.py",
        description="Reproduce Sec. IV / Fig. 1 of the PPDNMF paper (NMSE vs BCD iteration for several N_max, "
                    "centralized baseline, CBCL faces, consensus error, Paillier confirmation).",
    )
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: outputs/paper/<timestamp> in the repository)")
    p.add_argument("--trials", type=int, default=None,
                   help="trials of both sweeps unless --trials-synthetic / --trials-cbcl say otherwise")
    p.add_argument("--trials-synthetic", type=int, default=None, help="trials of the synthetic sweep (default 100, "
                                                                       "as in the paper)")
    p.add_argument("--trials-cbcl", type=int, default=None, help="trials of the CBCL sweep (default 100, as in the "
                                                                 "paper)")
    p.add_argument("--bcd-iters", type=int, default=None,
                   help="BCD iterations of both sweeps (paper: 100)")
    p.add_argument("--bcd-iters-cbcl", type=int, default=None,
                   help="BCD iterations of the CBCL sweep only (default: --bcd-iters, else 100)")
    p.add_argument("--admm-iters", type=int, default=None,
                   help="ADMM iterations of each X- and Y-step (paper: 30); for quick checks only")
    p.add_argument("--nmax", type=_float_list, default=list(PAPER_NMAX),
                   help="N_max values, comma or space separated (default: 10,1e2,1e3,1e4,1e5,1e6)")
    p.add_argument("--batch-synthetic", type=int, default=0,
                   help="synthetic trials per batched run (default 0: all at once)")
    p.add_argument("--batch-cbcl", type=int, default=1,
                   help="CBCL trials per batched run (default 1: on a CPU, batching CBCL trials is slower than "
                        "running them one by one, see docs/RESULTS.md); the numbers do not depend on it")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: torch's choice); 1 is robust on a busy machine")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--seed", type=int, default=0, help="trial t uses seed + t (default 0)")
    p.add_argument("--skip-cbcl", action="store_true", help="run the synthetic experiment only")
    p.add_argument("--skip-synthetic", action="store_true", help="run the CBCL experiment only")
    p.add_argument("--data-path", type=Path, default=None,
                   help="CBCL training set (.mat or folder of .pgm); default: $PPDNMF_CBCL "
                        "(get it from http://cbcl.mit.edu/software-datasets/FaceData2.html)")
    p.add_argument("--paillier-check", action=argparse.BooleanOptionalAction, default=True,
                   help="small real-Paillier run compared with the quantized run of the same trial (default: on)")
    p.add_argument("--paillier-trials", type=int, default=1)
    p.add_argument("--paillier-bcd-iters", type=int, default=5)
    p.add_argument("--paillier-key-bits", type=int, default=PAPER_KEY_BITS)
    p.add_argument("--figures-dir", type=Path, default=REPO_ROOT / "docs" / "figures",
                   help="where the PNGs are copied (default: docs/figures)")
    p.add_argument("--no-copy-figures", action="store_true", help="do not copy the PNGs to --figures-dir")
    p.add_argument("--no-tensorboard", action="store_true", help="do not write TensorBoard logs")
    p.add_argument("--replot", type=Path, default=None, metavar="DIR",
                   help="redraw the figures of an earlier run's output folder from its CSVs (no computation)")
    p.add_argument("--quiet", action="store_true")
    return p


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


class _Log:
    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __call__(self, *args):
        if not self.quiet:
            print(*args, flush=True)


def nmax_label(v: float) -> str:
    """``10`` -> ``1e1`` ... (used in CSV headers and TensorBoard tags)."""
    e = math.log10(v)
    if abs(e - round(e)) < 1e-12:
        return f"1e{int(round(e))}"
    return f"{v:g}"


def nmax_tex(v: float) -> str:
    e = math.log10(v)
    if abs(e - round(e)) < 1e-12:
        return f"$N_{{\\max}}=10^{{{int(round(e))}}}$"
    return f"$N_{{\\max}}={v:g}$"


def mean_std(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample std (ddof=1; 0 for one trial) over the trial axis (last)."""
    a = np.asarray(a, dtype=np.float64)
    m = a.mean(axis=-1)
    s = a.std(axis=-1, ddof=1) if a.shape[-1] > 1 else np.zeros_like(m)
    return m, s


def machine_info(device: str) -> dict:
    cpu_model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_csv(path: Path, header: list[str], rows) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for r in rows:
            w.writerow([repr(float(x)) if isinstance(x, (float, np.floating)) else x for x in r])


def curves_csv(path: Path, curves: dict) -> None:
    """``curves``: label -> (mean, std) arrays of one length; one row per BCD iteration."""
    labels = list(curves)
    n = len(next(iter(curves.values()))[0])
    header = ["iteration"] + [f"{lab}_{k}" for lab in labels for k in ("mean", "std")]
    rows = []
    for i in range(n):
        row = [i + 1]
        for lab in labels:
            m, s = curves[lab]
            row += [float(m[i]), float(s[i])]
        rows.append(row)
    write_csv(path, header, rows)


# ----------------------------------------------------------------------------
# plots (matplotlib, Agg)
# ----------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8,
                         "savefig.dpi": 110})
    return plt


def plot_curves(path: Path, curves: dict, styles: dict, *, ylabel: str, title: str, zoom: bool = False,
                legend_loc: str = "upper right", skip_first_in_ylim: bool = False) -> None:
    """Mean curves on a log y axis (the paper's style). ``zoom``: a second panel with the last half of
    the iterations on a linear axis, where the steady-state differences are visible."""
    plt = _plt()
    n = max(len(m) for m, _ in curves.values())
    zoom = zoom and n >= 10
    fig, axes = plt.subplots(1, 2 if zoom else 1, figsize=(10.0 if zoom else 5.6, 4.0), squeeze=False)
    ax = axes[0, 0]
    for lab, (m, _s) in curves.items():
        it = np.arange(1, len(m) + 1)
        st = styles[lab]
        ax.semilogy(it, np.maximum(m, np.finfo(float).tiny), label=st["label"], color=st["color"],
                    linestyle=st.get("ls", "-"), linewidth=st.get("lw", 1.3), marker="o" if len(m) == 1 else None)
    ax.set_xlabel("BCD iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.set_xlim(1, max(2, n))
    if skip_first_in_ylim and n > 1:
        # iteration 1 starts from Y = 0, where every agent computes the same X_i (consensus
        # error ~1e-15); keep the axis on the range the rest of the curve spans
        lo = min(float(np.min(m[1:])) for m, _ in curves.values() if len(m) > 1)
        hi = max(float(np.max(m)) for m, _ in curves.values())
        if lo > 0:
            ax.set_ylim(lo / 3, hi * 3)
    ax.legend(loc=legend_loc, ncol=1, frameon=True)
    if zoom:
        z = axes[0, 1]
        start = n // 2
        for lab, (m, _s) in curves.items():
            st = styles[lab]
            it = np.arange(1, len(m) + 1)
            z.plot(it[start:], m[start:], color=st["color"], linestyle=st.get("ls", "-"), linewidth=st.get("lw", 1.3),
                   label=st["label"])
        z.set_xlabel("BCD iteration")
        z.set_ylabel(ylabel + " (linear)")
        z.set_title(f"zoom: iterations {start + 1}-{n}", fontsize=10)
        z.ticklabel_format(axis="y", style="plain", useOffset=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_faces(path: Path, faces: list[dict]) -> None:
    plt = _plt()
    fig, axes = plt.subplots(len(faces), 2, figsize=(3.6, 1.8 * len(faces) + 0.3))
    axes = np.atleast_2d(axes)
    for row, f in zip(axes, faces):
        for ax, key, what in zip(row, ("original", "reconstruction"), ("original", "PPDNMF")):
            ax.imshow(f[key], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.grid(False)
            ax.set_title(f"#{f['number']} {what}", fontsize=9)
    fig.suptitle(f"CBCL faces, {faces[0]['nmax_tex']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def curve_styles(nmax_list: list[float]) -> dict:
    plt = _plt()
    cmap = plt.get_cmap("viridis")
    styles = {}
    for k, v in enumerate(nmax_list):
        c = cmap(0.9 * k / max(1, len(nmax_list) - 1))
        styles[f"nmax_{nmax_label(v)}"] = {"label": f"PPDNMF, {nmax_tex(v)}", "color": c}
    styles["centralized"] = {"label": "centralized", "color": "k", "ls": "--", "lw": 1.6}
    return styles


NMSE_FIG = {"synthetic": "fig1a_synthetic_nmse", "cbcl": "fig1b_cbcl_nmse"}
_DS_TITLE = {"synthetic": ("Fig. 1(a): synthetic data", "synthetic data"),
             "cbcl": ("Fig. 1(b): MIT-CBCL faces", "MIT-CBCL faces")}
_CONSENSUS_LABEL = "consensus error  max$_i\\|X_i-\\bar X\\|_F/\\|\\bar X\\|_F$"


def render_curves(png: Path, key: str, ds: str, curves: dict, trials: int, styles: dict) -> None:
    """The NMSE figure (Fig. 1(a)/(b), with a linear zoom panel) or the consensus figure of ``ds``."""
    fig_title, short = _DS_TITLE[ds]
    if key.startswith("consensus"):
        plot_curves(png, curves, styles, ylabel=_CONSENSUS_LABEL, legend_loc="lower left", skip_first_in_ylim=True,
                    title=f"Consensus error, {short}, mean of {trials} trial(s)")
    else:
        plot_curves(png, curves, styles, ylabel="NMSE", zoom=True, title=f"{fig_title}, mean of {trials} trial(s)")


def _read_curves_csv(path: Path) -> dict:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header, data = rows[0], np.array([[float(x) for x in r] for r in rows[1:]], dtype=np.float64)
    labels = [h[: -len("_mean")] for h in header[1:] if h.endswith("_mean")]
    return {lab: (data[:, header.index(f"{lab}_mean")], data[:, header.index(f"{lab}_std")]) for lab in labels}


def replot(out: Path, figures_dir: Path | None, log: _Log) -> dict:
    """Redraw every figure of an earlier run from its CSV files (no computation)."""
    summary = json.loads((out / "summary.json").read_text())
    figures = {}
    for ds, exp in summary["experiments"].items():
        if "skipped" in exp:
            continue
        for key in (NMSE_FIG[ds], f"consensus_{ds}"):
            curves = _read_curves_csv(out / f"{key}.csv")
            nmax = [float(lab[len("nmax_"):]) for lab in curves if lab.startswith("nmax_")]
            render_curves(out / f"{key}.png", key, ds, curves, exp["trials"], curve_styles(nmax))
            figures[key] = out / f"{key}.png"
        if "faces" in exp:
            with open(out / "fig1c_cbcl_faces.csv", newline="") as fh:
                rows = list(csv.reader(fh))
            header, data = rows[0], np.array([[float(x) for x in r] for r in rows[1:]])
            rr, cc = data[:, 0].astype(int), data[:, 1].astype(int)
            faces = []
            for f in exp["faces"]:
                img = {}
                for k in ("original", "reconstruction"):
                    a = np.zeros((19, 19))
                    a[rr, cc] = data[:, header.index(f"face{f['number']}_{k}")]
                    img[k] = a
                faces.append({**f, **img, "nmax_tex": nmax_tex(f["nmax"])})
            plot_faces(out / "fig1c_cbcl_faces.png", faces)
            figures["fig1c_cbcl_faces"] = out / "fig1c_cbcl_faces.png"
    if figures_dir is not None:
        figures_dir.mkdir(parents=True, exist_ok=True)
        for p in figures.values():
            shutil.copy2(p, figures_dir / p.name)
        log(f"figures copied to {figures_dir}")
    log(f"redrew {len(figures)} figure(s) in {out}")
    return figures


# ----------------------------------------------------------------------------
# experiments
# ----------------------------------------------------------------------------


def run_sweep(name: str, *, trials: int, nmax_list: list[float], seed: int, device, dtype, fit_over: dict,
              data_path: str | None, log: _Log, batch: int = 0) -> dict:
    """One experiment for every N_max (quantized exchange) plus the centralized baseline.

    The centralized baseline depends only on the trials' data (same seeds, one agent, no
    exchange), so it runs once, with the first N_max run. ``batch`` trials run as one batched
    computation (0: all); trial ``t`` always uses seed ``seed + t`` and gives the same bits
    alone or in a batch, so ``batch`` changes the wall time only.
    """
    from ppdnmf_torch.models.ppdnmf.config import to_dict
    from ppdnmf_torch.models.ppdnmf.experiments import run_experiment

    extra = dict(fit_over)
    if data_path is not None:
        extra["data_path"] = data_path
    batch = trials if batch <= 0 else min(batch, trials)
    chunks = [(off, min(batch, trials - off)) for off in range(0, trials, batch)]
    out = {"name": name, "trials": trials, "batch": batch, "nmax": list(nmax_list), "runs": {},
           "centralized": None, "keep": None}
    keep_nmax = max(nmax_list)
    for k, v in enumerate(nmax_list):
        log(f"[{name}] N_max={v:g}: {trials} trial(s) in {len(chunks)} batch(es) ...")
        parts, cparts, secs, csecs = [], [], 0.0, 0.0
        for off, size in chunks:
            res = run_experiment(name, trials=size, seed=seed + off, centralized=(k == 0), device=device,
                                 dtype=dtype, exchange="quantized", n_max=v, key_bits=PAPER_KEY_BITS, **extra)
            h = res.history
            parts.append((np.asarray(h["nmse"], dtype=np.float64), np.asarray(h["consensus"], dtype=np.float64)))
            secs += float(res.seconds["distributed"])
            if k == 0:
                cparts.append(np.asarray(h["centralized_nmse"], dtype=np.float64))
                csecs += float(res.seconds["centralized"])
                out["spec"] = to_dict(res.config)
            if v == keep_nmax and off == 0:
                out["keep"] = res  # trial 0 (seed), for the faces
            del res
        run = {"nmse": np.concatenate([p[0] for p in parts], axis=1),
               "consensus": np.concatenate([p[1] for p in parts], axis=1), "seconds": secs}
        out["runs"][v] = run
        if k == 0:
            out["centralized"] = {"nmse": np.concatenate(cparts, axis=1), "seconds": csecs}
        log(f"[{name}] N_max={v:g}: final NMSE {run['nmse'][-1].mean():.6g}, consensus "
            f"{run['consensus'][-1].mean():.3g} ({secs:.1f} s" + (f", centralized {csecs:.1f} s)" if k == 0 else ")"))
    out["keep_nmax"] = keep_nmax
    return out


def faces_from_result(res, Z: torch.Tensor, numbers=FACES, nmax: float = 1e6) -> list[dict]:
    """Original and agent reconstruction ``X_i Y_i[:, c]`` of faces given by 1-based number (trial 0)."""
    from ppdnmf_torch.data import CBCL_SHAPE

    counts = list(res.distributed.columns[0])
    starts = np.concatenate([[0], np.cumsum(counts)])
    X = res.distributed.X[0]
    Ys = res.distributed.trial_Y(0)
    faces = []
    for num in numbers:
        g = num - 1
        if not 0 <= g < Z.shape[1]:
            raise ValueError(f"face #{num}: the data has {Z.shape[1]} columns")
        agent = int(np.searchsorted(starts, g, side="right") - 1)
        local = int(g - starts[agent])
        rec = (X[agent] @ Ys[agent][:, local]).detach().cpu().double()
        orig = Z[:, g].detach().cpu().double()
        faces.append({
            "number": num, "column": g, "agent": agent, "local_column": local,
            "original": orig.numpy().reshape(CBCL_SHAPE, order="F"),
            "reconstruction": rec.numpy().reshape(CBCL_SHAPE, order="F"),
            "rel_error": float(torch.linalg.vector_norm(orig - rec) / torch.linalg.vector_norm(orig)),
            "nmax": nmax, "nmax_tex": nmax_tex(nmax),
        })
    return faces


def paillier_check(*, trials: int, bcd_iters: int, admm_iters: int | None, key_bits: int, seed: int,
                   nmax: float, log: _Log) -> dict:
    """Real Paillier (``exchange="paillier"``) against ``quantized`` on the same synthetic trial(s)."""
    import ppdnmf_torch as pp
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial

    try:
        from ppdnmf_torch.exchange import paillier as _paillier  # noqa: F401
    except Exception as exc:  # the module is optional at this stage of the project
        msg = f"Paillier exchange not importable ({type(exc).__name__}: {exc}); check skipped"
        log("[paillier] " + msg)
        return {"status": "skipped", "reason": msg}
    spec = PAPER_EXPERIMENTS["paper_synthetic"]
    s = dataclasses.asdict(spec.solver)
    kw = dict(mu=s["mu"], eta=s["eta"], g_max=s["g_max"], bcd_iters=bcd_iters,
              x_iters=admm_iters or s["x_iters"], y_iters=admm_iters or s["y_iters"],
              n_max=nmax, key_bits=key_bits, negative=spec.data.negative, device="cpu",
              dtype=torch.float64)
    out = {"status": "ok", "trials": [], "key_bits": key_bits, "bcd_iters": bcd_iters,
           "x_iters": kw["x_iters"], "y_iters": kw["y_iters"], "n_max": nmax}
    for t in range(trials):
        sd = seed + t
        blocks, graph = make_trial(spec, sd)
        log(f"[paillier] trial seed {sd}: {bcd_iters} BCD iterations, {key_bits}-bit keys ...")
        t0 = time.perf_counter()
        q = pp.fit(blocks, graph, s["rank"], seed=sd, exchange="quantized", **kw)
        tq = time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # 128-bit keys are the paper's setting, insecure by design
                r = pp.fit(blocks, graph, s["rank"], seed=sd, exchange="paillier", **kw)
        except Exception as exc:
            msg = f"Paillier run failed ({type(exc).__name__}: {exc})"
            log("[paillier] " + msg)
            return {"status": "failed", "reason": msg}
        tp = time.perf_counter() - t0
        identical = (list(r.history["nmse"]) == list(q.history["nmse"])) and bool(torch.equal(r.X, q.X))
        costs = {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                 for k, v in (r.costs or {}).items()}
        costs = {k: v for k, v in costs.items() if isinstance(v, (float, int, str, bool))}
        rec = {"seed": sd, "identical": identical, "nmse_paillier": list(map(float, r.history["nmse"])),
               "nmse_quantized": list(map(float, q.history["nmse"])),
               "max_abs_nmse_diff": float(np.max(np.abs(np.subtract(r.history["nmse"], q.history["nmse"])))),
               "seconds_paillier": tp, "seconds_quantized": tq, "costs": costs,
               "edges": len(graph.edges), "agents": graph.n_agents}
        out["trials"].append(rec)
        log(f"[paillier] seed {sd}: identical to quantized: {identical}; {tp:.1f} s "
            f"(quantized {tq:.2f} s); costs: " + ", ".join(f"{k}={v:.4g}" for k, v in costs.items()
                                                          if isinstance(v, float)))
    out["all_identical"] = all(t["identical"] for t in out["trials"])
    return out


# ----------------------------------------------------------------------------
# reporting
# ----------------------------------------------------------------------------


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.3e}"


def _paired(a: np.ndarray, b: np.ndarray) -> dict:
    """Per-trial difference ``a - b`` of two final values: mean, std, and how many trials have a > b."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return {"mean": float(d.mean()), "std": float(d.std(ddof=1)) if d.size > 1 else 0.0,
            "trials_greater": int((d > 0).sum()), "trials_less": int((d < 0).sum()), "trials": int(d.size)}


def summarize_sweep(sw: dict) -> dict:
    rows = []
    c = sw["centralized"]
    largest = max(sw["runs"])
    for v, run in sw["runs"].items():
        fm, fs = mean_std(run["nmse"][-1:])
        cm, cs = mean_std(run["consensus"][-1:])
        rows.append({"curve": f"nmax_{nmax_label(v)}", "n_max": v, "final_nmse_mean": float(fm[0]),
                     "final_nmse_std": float(fs[0]), "final_consensus_mean": float(cm[0]),
                     "final_consensus_std": float(cs[0]), "seconds": run["seconds"],
                     "nmse_minus_centralized": _paired(run["nmse"][-1], c["nmse"][-1]),
                     "nmse_minus_largest_nmax": _paired(run["nmse"][-1], sw["runs"][largest]["nmse"][-1])})
    fm, fs = mean_std(c["nmse"][-1:])
    rows.append({"curve": "centralized", "n_max": None, "final_nmse_mean": float(fm[0]),
                 "final_nmse_std": float(fs[0]), "final_consensus_mean": None, "final_consensus_std": None,
                 "seconds": c["seconds"]})
    bcd = int(next(iter(sw["runs"].values()))["nmse"].shape[0])
    solver = {k: v for k, v in sw["spec"]["solver"].items()}
    return {"experiment": sw["name"], "trials": sw["trials"], "batch": sw["batch"], "bcd_iters": bcd,
            "solver": solver, "rows": rows, "largest_nmax": largest,
            "total_seconds": float(sum(r["seconds"] for r in rows))}


def final_values_rows(ds: str, sw: dict, seed: int):
    """One row per (curve, trial): the final NMSE and consensus error of every trial."""
    for v, run in sw["runs"].items():
        for t in range(run["nmse"].shape[1]):
            yield [ds, seed + t, f"nmax_{nmax_label(v)}", float(run["nmse"][-1, t]), float(run["consensus"][-1, t])]
    c = sw["centralized"]["nmse"]
    for t in range(c.shape[1]):
        yield [ds, seed + t, "centralized", float(c[-1, t]), ""]


def summary_markdown(summary: dict) -> str:
    lines = ["# PPDNMF, Sec. IV reproduction", "", f"Command: `{summary['command']}`", "",
             f"Started {summary['started']}, total wall time {summary['total_seconds']:.1f} s.", ""]
    m = summary["machine"]
    lines += ["Machine: " + ", ".join(f"{k}={v}" for k, v in m.items()), ""]
    for key, title in (("synthetic", "Synthetic (paper_synthetic)"), ("cbcl", "MIT-CBCL (paper_cbcl)")):
        s = summary["experiments"].get(key)
        if s is None:
            continue
        if "skipped" in s:
            lines += [f"## {title}", "", f"Skipped: {s['skipped']}", ""]
            continue
        sv = s["solver"]
        lines += [f"## {title}", "",
                  f"{s['trials']} trial(s), {s['bcd_iters']} BCD iterations of {sv['x_iters']} + {sv['y_iters']} "
                  f"ADMM iterations, exchange=quantized ({PAPER_KEY_BITS}-bit codec range), "
                  f"K={sv['rank']}, mu={sv['mu']}, eta={sv['eta']}, g_i={sv['g_max']}; "
                  f"{s['batch']} trial(s) per batched run.", "",
                  "| curve | final NMSE (mean ± std) | final consensus error (mean ± std) | "
                  "NMSE − centralized, per trial (mean ± std; trials above) | wall time (s) |",
                  "|---|---|---|---|---|"]
        for r in s["rows"]:
            name = "centralized" if r["n_max"] is None else f"N_max = {r['n_max']:g}"
            cons = ("—" if r["final_consensus_mean"] is None
                    else f"{_fmt(r['final_consensus_mean'])} ± {_fmt(r['final_consensus_std'])}")
            pc = r.get("nmse_minus_centralized")
            diff = "—" if pc is None else (f"{pc['mean']:+.2e} ± {pc['std']:.2e}; "
                                           f"{pc['trials_greater']}/{pc['trials']}")
            lines.append(f"| {name} | {r['final_nmse_mean']:.5f} ± {r['final_nmse_std']:.5f} | {cons} | {diff} | "
                         f"{r['seconds']:.1f} |")
        lines.append("")
        if "faces" in s:
            for f in s["faces"]:
                lines.append(f"Face #{f['number']} (global column {f['column']}, agent {f['agent']}, local column "
                             f"{f['local_column']}): relative reconstruction error {f['rel_error']:.4f}.")
            lines.append("")
    pc = summary.get("paillier_check")
    if pc is not None:
        lines += ["## Paillier confirmation", ""]
        if pc.get("status") != "ok":
            lines += [f"{pc.get('status')}: {pc.get('reason')}", ""]
        else:
            lines.append(f"exchange=paillier vs exchange=quantized, paper_synthetic, {pc['key_bits']}-bit keys, "
                         f"N_max={pc['n_max']:g}, {pc['bcd_iters']} BCD iterations of {pc['x_iters']} + "
                         f"{pc['y_iters']} ADMM iterations.")
            lines.append("")
            for t in pc["trials"]:
                lines.append(f"- seed {t['seed']}: NMSE curves identical: **{t['identical']}** "
                             f"(max |diff| {t['max_abs_nmse_diff']:.3g}); Paillier run {t['seconds_paillier']:.1f} s, "
                             f"quantized {t['seconds_quantized']:.2f} s; "
                             f"{t['agents']} agents, {t['edges']} edges.")
                c = t["costs"]
                if c:
                    lines.append("  - measured costs: " + ", ".join(
                        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items()))
            lines.append("")
    return "\n".join(lines) + "\n"


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, torch.dtype):
        return str(o)
    return repr(o)


# ----------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------


def _resolve_data_path(arg: Path | None) -> tuple[Path | None, str | None]:
    from ppdnmf_torch.models.ppdnmf.experiments import CBCL_ENV, default_cbcl_path

    if arg is not None:
        p = arg if arg.is_absolute() else (Path.cwd() / arg)
        if not p.exists():
            return None, f"CBCL data not found at {p} (given with --data-path)"
        return p, None
    where = default_cbcl_path()
    hint = ("get the MIT-CBCL training set (2429 faces, 19x19) from "
            "http://cbcl.mit.edu/software-datasets/FaceData2.html and pass --data-path (or set "
            f"${CBCL_ENV}), or use --skip-cbcl")
    if where is None:
        return None, f"no CBCL data path given; {hint}"
    p = Path(where).resolve()
    if not p.exists():
        return None, f"CBCL data not found at {p} (from ${CBCL_ENV}); {hint}"
    return p, None


def _tb_writer(out: Path, enabled: bool):
    if not enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception as exc:  # tensorboard missing: the rest still runs
        print(f"TensorBoard logging off ({exc})", file=sys.stderr)
        return None
    return SummaryWriter(log_dir=str(out / "tb"))


def _tb_curves(writer, prefix: str, curves: dict) -> None:
    if writer is None:
        return
    for lab, (m, s) in curves.items():
        for i, (mv, sv) in enumerate(zip(m, s)):
            writer.add_scalar(f"{prefix}/{lab}", float(mv), i + 1)
            writer.add_scalar(f"{prefix}_std/{lab}", float(sv), i + 1)


def main(argv=None) -> dict:
    """Run the reproduction; returns the curves, tables and output paths (used by the tests)."""
    args = build_parser().parse_args(argv)
    log = _Log(args.quiet)
    if args.replot is not None:
        return {"figures": replot(args.replot, None if args.no_copy_figures else args.figures_dir, log)}
    default_trials = 100 if args.trials is None else args.trials
    if args.trials_synthetic is None:
        args.trials_synthetic = default_trials
    if args.trials_cbcl is None:
        args.trials_cbcl = default_trials
    for name in ("trials_synthetic", "trials_cbcl", "paillier_trials", "paillier_bcd_iters"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: must be >= 1")
    started = _dt.datetime.now()
    out = args.out or (REPO_ROOT / "outputs" / "paper" / started.strftime("%Y%m%d-%H%M%S"))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if args.threads is not None:
        torch.set_num_threads(max(1, args.threads))
    from ppdnmf_torch._utils import resolve_device

    device = resolve_device(args.device)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    nmax_list = list(args.nmax)
    fit_over = {}
    if args.admm_iters is not None:
        fit_over.update(x_iters=args.admm_iters, y_iters=args.admm_iters)
    styles = curve_styles(nmax_list)
    writer = _tb_writer(out, not args.no_tensorboard)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    summary = {"command": "python scripts/reproduce_paper.py " + shlex.join(argv_list),
               "started": started.isoformat(timespec="seconds"), "machine": machine_info(str(device)),
               "args": vars(args), "experiments": {}, "figures": [], "csv": []}
    result = {"out": out, "curves": {}, "figures": {}, "csv": {}, "faces": None, "summary": summary}
    t_all = time.perf_counter()
    final_rows: list = []

    def emit(key: str, ds: str, curves: dict, trials: int, tb_prefix: str):
        png, csvp = out / f"{key}.png", out / f"{key}.csv"
        render_curves(png, key, ds, curves, trials, styles)
        curves_csv(csvp, curves)
        _tb_curves(writer, tb_prefix, curves)
        result["curves"][key] = curves
        result["figures"][key] = png
        result["csv"][key] = csvp

    jobs = []
    if not args.skip_synthetic:
        jobs.append(("synthetic", "paper_synthetic", args.trials_synthetic, args.bcd_iters, None,
                     args.batch_synthetic))
    if not args.skip_cbcl:
        path, why = _resolve_data_path(args.data_path)
        if path is None:
            if args.data_path is not None:
                raise SystemExit(why)
            log(f"[cbcl] skipped: {why}")
            summary["experiments"]["cbcl"] = {"skipped": why}
        else:
            jobs.append(("cbcl", "paper_cbcl", args.trials_cbcl, args.bcd_iters_cbcl or args.bcd_iters, str(path),
                         args.batch_cbcl))
    else:
        summary["experiments"]["cbcl"] = {"skipped": "--skip-cbcl"}

    for ds, name, trials, bcd, data_path, batch in jobs:
        over = dict(fit_over)
        if bcd is not None:
            over["bcd_iters"] = bcd
        sw = run_sweep(name, trials=trials, nmax_list=nmax_list, seed=args.seed, device=device, dtype=dtype,
                       fit_over=over, data_path=data_path, log=log, batch=batch)
        nm = {f"nmax_{nmax_label(v)}": mean_std(run["nmse"]) for v, run in sw["runs"].items()}
        nm["centralized"] = mean_std(sw["centralized"]["nmse"])
        emit(NMSE_FIG[ds], ds, nm, trials, f"{ds}/nmse")
        cons = {f"nmax_{nmax_label(v)}": mean_std(run["consensus"]) for v, run in sw["runs"].items()}
        emit(f"consensus_{ds}", ds, cons, trials, f"{ds}/consensus")
        s = summarize_sweep(sw)
        summary["experiments"][ds] = s
        final_rows.extend(final_values_rows(ds, sw, args.seed))
        result.setdefault("sweeps", {})[ds] = sw
        if ds == "cbcl":
            from ppdnmf_torch.data import load_cbcl

            Z = load_cbcl(data_path)
            faces = faces_from_result(sw["keep"], Z, FACES, sw["keep_nmax"])
            png, csvp = out / "fig1c_cbcl_faces.png", out / "fig1c_cbcl_faces.csv"
            plot_faces(png, faces)
            s["faces_nmax"] = sw["keep_nmax"]
            rows = []
            for r in range(19):
                for c in range(19):
                    row = [r, c]
                    for f in faces:
                        row += [float(f["original"][r, c]), float(f["reconstruction"][r, c])]
                    rows.append(row)
            header = ["pixel_row", "pixel_col"] + [f"face{f['number']}_{k}" for f in faces
                                                   for k in ("original", "reconstruction")]
            write_csv(csvp, header, rows)
            result["figures"]["fig1c_cbcl_faces"] = png
            result["csv"]["fig1c_cbcl_faces"] = csvp
            result["faces"] = faces
            s["faces"] = [{k: v for k, v in f.items() if k not in ("original", "reconstruction", "nmax_tex")}
                          for f in faces]
            if writer is not None:
                for f in faces:
                    pair = np.concatenate([f["original"], np.clip(f["reconstruction"], 0, 1)], axis=1)
                    writer.add_image(f"cbcl/face_{f['number']}_original_vs_reconstruction",
                                     torch.from_numpy(pair).float(), 0, dataformats="HW")
        del sw["keep"]

    if args.paillier_check:
        pc = paillier_check(trials=args.paillier_trials, bcd_iters=args.paillier_bcd_iters,
                            admm_iters=args.admm_iters, key_bits=args.paillier_key_bits, seed=args.seed,
                            nmax=max(nmax_list), log=log)
        summary["paillier_check"] = pc
        if writer is not None and pc.get("status") == "ok":
            for t in pc["trials"]:
                for i, (a, b) in enumerate(zip(t["nmse_paillier"], t["nmse_quantized"])):
                    writer.add_scalar(f"paillier_check/seed{t['seed']}/nmse_paillier", a, i + 1)
                    writer.add_scalar(f"paillier_check/seed{t['seed']}/nmse_quantized", b, i + 1)
                for k, v in t["costs"].items():
                    if isinstance(v, float):
                        writer.add_scalar(f"paillier_check/seed{t['seed']}/costs/{k}", v, 0)
        result["paillier_check"] = pc

    if final_rows:
        write_csv(out / "final_values.csv", ["dataset", "seed", "curve", "final_nmse", "final_consensus"], final_rows)
        result["csv"]["final_values"] = out / "final_values.csv"
    summary["total_seconds"] = time.perf_counter() - t_all
    summary["figures"] = [str(p.name) for p in result["figures"].values()]
    summary["csv"] = [str(p.name) for p in result["csv"].values()]
    md = summary_markdown(summary)
    (out / "summary.md").write_text(md)
    with open(out / "summary.json", "w") as fh:
        json.dump(summary, fh, indent=2, default=_json_default)
    if writer is not None:
        writer.add_text("summary", md, 0)
        writer.close()
    if not args.no_copy_figures and result["figures"]:
        args.figures_dir.mkdir(parents=True, exist_ok=True)
        for p in result["figures"].values():
            shutil.copy2(p, args.figures_dir / p.name)
        log(f"figures copied to {args.figures_dir}")
    log(md)
    log(f"outputs in {out}")
    return result


if __name__ == "__main__":
    main()
