"""The files a run writes into its folder, and the summary the CLI prints.

* ``config.yaml``: the validated config (after defaults), as run;
* ``factors.pt``: ``torch.save`` of a dict of tensors: ``X (N, L, K)``, ``Y`` (list of N
  ``(K, M_i)``), ``U (N, L, K)``, ``X_mean (L, K)``, ``columns (N,)``, ``edges (E, 2)``,
  and ``centralized_X (L, K)``, ``centralized_Y (K, M)`` with the baseline;
* ``history.csv``: one row per BCD iteration, every scalar metric (``nmse``,
  ``consensus``, ``objective``, the ADMM residuals, step times, mean ADMM iteration
  counts, ``centralized_nmse``, ``centralized_objective``, cumulative ``crypto_*`` costs);
* ``history.json``: the full histories, ``{"distributed": ..., "centralized": ...}``;
* ``summary.json``: final metrics, wall times, device, sizes, exchange costs, the data set's
  name, what was degenerate about the result (``degenerate``, empty when nothing).

A batched run (``trials > 1``) writes ``factors.pt`` (``X_mean (T, L, K)``, ``Y (T, N, K, M_max)``,
``columns (T, N)``, ``seeds (T,)``), ``history.csv`` (one row per trial and BCD iteration),
``history.json`` (arrays ``(n_iter, T)``), ``trials.csv`` (one row per trial: its seed and
final metrics) and ``summary.json`` with the mean, standard deviation, minimum and maximum
over the trials. Every file is written atomically (:func:`~ppdnmf_torch.checkpoint.write_atomically`):
a run killed while writing leaves the previous file or none, never a torn one.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
from pathlib import Path

import torch

from .._utils import counted, plain_number
from ..checkpoint import write_atomically
from ..models.ppdnmf.config import exchange_to_dict
from .costs import format_costs
from ..exchange.costmodel import COUNT_KEYS

__all__ = ["write_yaml", "write_factors", "write_histories", "write_summary", "summary_of", "format_summary",
           "plain", "numeric", "dataset_name", "run_name", "write_trials", "trials_summary", "write_text",
           "write_arrays", "write_history_csv"]

#: the paper's presets and the data kind each runs on (``name`` is only theirs on that data)
_PRESET_DATA = {"paper_synthetic": "synthetic", "paper_cbcl": "cbcl"}


def dataset_name(cfg) -> str:
    """The data set's own name: ``synthetic``, ``cbcl``, or the file's name (``z.csv``)."""
    d = cfg.data
    if d.kind in ("synthetic", "cbcl") or not d.path:
        return d.kind
    return os.path.basename(os.path.normpath(str(d.path)))


def run_name(cfg) -> str:
    """The run's label: ``cfg.name``, except that a paper preset's name on other data (say
    ``data=csv`` under the default ``experiment=paper_synthetic``) gives way to the data set's."""
    want = _PRESET_DATA.get(cfg.name)
    if want is not None and cfg.data.kind != want:
        return dataset_name(cfg)
    return cfg.name


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path``, atomically, as UTF-8."""
    data = text.encode("utf-8")
    write_atomically(str(path), lambda fh: fh.write(data))

#: the exchange's counters written as integers in history.csv
_COUNT_COLUMNS = COUNT_KEYS + ("key_pairs",)


def plain(v):
    """JSON-friendly copy of history values (tensors -> lists, non-finite floats -> strings)."""
    if isinstance(v, torch.Tensor):
        return plain(v.tolist())
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def numeric(costs: dict | None) -> dict:
    """The numbers of a costs dict (``bytes_per_edge``, transcripts and the like left out)."""
    out = {}
    for k, v in (costs or {}).items():
        v = plain_number(v)
        if v is not None:
            out[str(k)] = v
    return out


def _mean(v):
    if isinstance(v, (list, tuple)) and v:
        return sum(float(x) for x in v) / len(v)
    if isinstance(v, (int, float)):
        return float(v)
    return None


def history_rows(dist, central) -> list[dict]:
    """One row per BCD iteration: the metrics, per-agent means of the ADMM counts, the
    centralized curve and the exchange's cumulative ``crypto_*`` costs (all in the history,
    so a resumed run's rows cover the interrupted segment too)."""
    h = dist.history
    n = len(h.get("nmse", []))
    # a crypto_* counter that one segment of a resumed run did not log (another exchange
    # kind) is shorter: its missing rows stay empty rather than the column being dropped
    scalar_keys = [k for k, vals in h.items()
                   if (len(vals) == n or (k.startswith("crypto_") and len(vals) < n))
                   and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals)]
    list_keys = [k for k, vals in h.items() if k not in scalar_keys and len(vals) == n]
    ch = central.history if central is not None else {}
    rows = []
    for i in range(n):
        row = {"iteration": i + 1}
        for k in scalar_keys:
            if i < len(h[k]):
                v = float(h[k][i])
                # counts stay integers in the CSV (the history holds floats: checkpoints do)
                row[k] = int(v) if k.startswith("crypto_") and k[7:] in _COUNT_COLUMNS and v.is_integer() else v
        for k in list_keys:
            m = _mean(h[k][i])
            if m is not None:
                row[f"{k}_mean"] = m
        if central is not None:
            for k in ("nmse", "objective"):
                vals = ch.get(k, [])
                row[f"centralized_{k}"] = float(vals[i]) if i < len(vals) else float("nan")
        rows.append(row)
    return rows


def _write_csv(path: Path, rows: list[dict]) -> None:
    columns = []
    for r in rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=columns or ["iteration"], restval="")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    write_text(path, buf.getvalue())


def write_arrays(folder: Path, arrays) -> list:
    """Each array as ``folder/<name>.npy`` (NumPy, no pickles; ``/`` in a name becomes ``_``), each
    written atomically; returns the names."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for k, v in arrays.items():
        a = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        name = k.replace("/", "_")
        write_atomically(str(folder / f"{name}.npy"), lambda fh, a=a: np.save(fh, a, allow_pickle=False))
        names.append(name)
    return names


def write_history_csv(path: Path, histories) -> None:
    """``history.csv`` of a model's batched fit: one row per (iteration, 1-based; trial, 0-based), one
    column per history ``(n_iter, T)`` or ``(n_iter,)`` (a history shorter or narrower than the
    others leaves its cells empty)."""
    import numpy as np

    hs = {k: np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v, dtype=np.float64)
          for k, v in histories.items()}
    hs = {k: (a[:, None] if a.ndim == 1 else a.reshape(a.shape[0], -1)) for k, a in hs.items()}
    n = max((a.shape[0] for a in hs.values()), default=0)
    T = max((a.shape[1] for a in hs.values()), default=1)
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["iteration", "trial", *hs])
    for i in range(n):
        for t in range(T):
            w.writerow([i + 1, t, *(repr(float(a[i, t])) if i < a.shape[0] and t < a.shape[1] else ""
                                for a in hs.values())])
    write_text(path, buf.getvalue())


def write_yaml(path: Path, d: dict) -> None:
    import yaml  # PyYAML, a dependency of omegaconf; plain data only

    write_text(path, yaml.safe_dump(d, sort_keys=False, default_flow_style=None))


def write_factors(path: Path, result, central, graph, scale: float = 1.0) -> None:
    """``factors.pt``: every agent's factors, the split, the graph's edges, the baseline's factors
    (and ``data_scale`` when the data were divided by it: ``Z ~ data_scale * X Y``)."""
    factors = {
        "X": result.X.detach().cpu(),
        "Y": [y.detach().cpu() for y in result.Y],
        "U": result.U.detach().cpu(),
        "X_mean": result.X_mean.detach().cpu(),
        "columns": torch.tensor(result.columns, dtype=torch.long),
        "edges": torch.tensor(graph.edges, dtype=torch.long).reshape(-1, 2),
    }
    if central is not None:
        factors["centralized_X"] = central.X[0].detach().cpu()
        factors["centralized_Y"] = central.Y[0].detach().cpu()
    if scale != 1.0:
        factors["data_scale"] = torch.tensor(float(scale), dtype=torch.float64)
    write_atomically(str(path), lambda fh: torch.save(factors, fh))


def write_histories(out: Path, result, central) -> None:
    """``history.csv`` and ``history.json``."""
    _write_csv(out / "history.csv", history_rows(result, central))
    write_text(out / "history.json", json.dumps({"distributed": plain(result.history),
                                                 "centralized": plain(central.history) if central is not None
                                                 else None}))


def summary_of(cfg, inputs, fits, out: Path) -> dict:
    """The run's summary (final metrics, wall times, device, sizes, costs); ``wall_time.total``
    is set when the run ends."""
    result, central, s, e = fits.result, fits.central, cfg.solver, cfg.exchange

    def both(fn):
        return {"distributed": fn(result), "centralized": fn(central) if central is not None else None}

    L, M = inputs.Z.shape
    return {
        "name": run_name(cfg),
        "data": {"kind": cfg.data.kind, "name": dataset_name(cfg), "scale": inputs.scale},
        "nmse": both(lambda r: r.nmse),
        "consensus": result.consensus,
        "nmse_worst": result.history["nmse_worst"][-1] if result.history.get("nmse_worst") else None,
        "objective": both(lambda r: r.history["objective"][-1]),
        "n_iter": both(lambda r: r.n_iter),
        "converged": both(lambda r: r.converged),
        "wall_time": {
            "distributed": fits.seconds["distributed"],
            "centralized": fits.seconds.get("centralized") if central is not None else None,
            "x_steps": float(sum(result.history.get("time_x", []))),
            "y_steps": float(sum(result.history.get("time_y", []))),
            "total": None,
        },
        "device": str(inputs.device),
        "dtype": cfg.dtype,
        "threads": torch.get_num_threads(),
        "degenerate": list(fits.degenerate),
        "sizes": {"L": L, "M": M, "K": s.rank, "n_agents": inputs.graph.n_agents, "n_edges": inputs.graph.n_edges,
                  "columns": list(result.columns)},
        "exchange": exchange_to_dict(e),
        "costs": numeric(result.costs),
        "bytes_per_edge": plain(result.costs.get("bytes_per_edge")) if isinstance(result.costs, dict) else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "out_dir": str(out.resolve()),
    }


def write_summary(path: Path, summary: dict) -> None:
    write_text(path, json.dumps(plain(summary), indent=2))


def _stat(d: dict | None, fmt: str) -> str:
    return f"{d['mean']:{fmt}} +- {d['std']:{fmt}} (min {d['min']:{fmt}}, max {d['max']:{fmt}})"


def _threads(n) -> str:
    return "threads ?" if n is None else counted(n, "thread")


def format_summary(summary: dict) -> str:
    """Human-readable lines of a run's summary (what the CLI prints)."""
    nm, wt = summary["nmse"], summary["wall_time"]
    if "trials" in summary:
        lines = [f"{summary['trials']} trials (seeds {summary['seeds'][0]}..{summary['seeds'][-1]}), "
                 f"final NMSE after {counted(summary['n_iter']['distributed'], 'BCD iteration')}: distributed "
                 f"{_stat(nm['distributed'], '.6g')}"]
        if nm.get("centralized") is not None:
            lines.append(f"  centralized {_stat(nm['centralized'], '.6g')}")
        lines.append(f"  consensus {_stat(summary['consensus'], '.3g')}")
    else:
        central = nm.get("centralized")
        lines = [
            f"final NMSE after {counted(summary['n_iter']['distributed'], 'BCD iteration')}: "
            f"distributed {nm['distributed']:.6g}"
            + (f" | centralized {central:.6g}" if central is not None else "")
            + (f" | consensus {summary['consensus']:.3g}" if summary.get("consensus") is not None else "")
            + (f" | worst agent {summary['nmse_worst']:.6g}" if summary.get("nmse_worst") is not None else ""),
        ]
    lines.append(f"wall time: distributed {wt['distributed']:.2f} s"
                 + (f", centralized {wt['centralized']:.2f} s" if wt.get("centralized") is not None else "")
                 + f" ({summary['device']}, {summary['dtype']}, {_threads(summary.get('threads'))}, exchange "
                 f"{summary['exchange']['kind']})")
    costs = summary.get("costs") or {}
    if costs:
        lines.append(f"exchange costs: {format_costs(costs)}")
    lines.append(f"outputs: {summary['out_dir']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Batched trials
# --------------------------------------------------------------------------------------


def _stats(values) -> dict:
    v = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    return {"mean": float(v.mean()), "std": float(v.std()) if v.numel() > 1 else 0.0,
            "min": float(v.min()), "max": float(v.max())}


def trials_summary(cfg, exp, out: Path, device) -> dict:
    """The summary of a batched run (:class:`~ppdnmf_torch.models.ppdnmf.experiments.ExperimentResult`): the
    mean, standard deviation, minimum and maximum over the trials of the final metrics."""
    dist, cent, h = exp.distributed, exp.centralized, exp.history
    last = {k: h[k][-1] for k in ("nmse", "consensus") if k in h}
    L, K = dist.X.shape[-2:]
    return {
        "name": run_name(cfg),
        "data": {"kind": cfg.data.kind, "name": dataset_name(cfg), "scale": None},
        "trials": exp.n_trials,
        "seeds": list(dist.seeds),
        "nmse": {"distributed": _stats(last["nmse"]),
                 "centralized": _stats(cent.history["nmse"][-1]) if cent is not None else None},
        "consensus": _stats(last["consensus"]),
        "n_iter": {"distributed": dist.n_iter, "centralized": cent.n_iter if cent is not None else None},
        "wall_time": {"distributed": exp.seconds["distributed"], "centralized": exp.seconds.get("centralized"),
                      "total": None},
        "device": str(device),
        "dtype": cfg.dtype,
        "threads": torch.get_num_threads(),
        "degenerate": [],
        "sizes": {"L": int(L), "K": int(K), "n_agents": len(dist.columns[0]), "M": int(sum(dist.columns[0]))},
        "exchange": exchange_to_dict(cfg.exchange),
        "costs": numeric(dist.costs),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "out_dir": str(out.resolve()),
    }


def write_trials(out: Path, exp) -> None:
    """``factors.pt``, ``history.csv``, ``history.json`` and ``trials.csv`` of a batched run."""
    dist, cent, h = exp.distributed, exp.centralized, exp.history
    factors = {"X_mean": dist.X.mean(dim=1).detach().cpu(), "Y": dist.Y.detach().cpu(),
               "columns": torch.tensor(dist.columns, dtype=torch.long),
               "seeds": torch.tensor(dist.seeds, dtype=torch.long)}
    write_atomically(str(out / "factors.pt"), lambda fh: torch.save(factors, fh))
    n, T = h["nmse"].shape
    per_trial = [k for k, v in h.items() if getattr(v, "ndim", 0) == 2 and v.shape == (n, T)]
    rows = []
    for t in range(T):
        for i in range(n):
            row = {"trial": t, "seed": dist.seeds[t], "iteration": i + 1}
            row.update({k: float(h[k][i, t]) for k in per_trial})
            rows.append(row)
    _write_csv(out / "history.csv", rows)
    ch = cent.history if cent is not None else None
    _write_csv(out / "trials.csv", [
        {"trial": t, "seed": dist.seeds[t], "nmse": float(h["nmse"][-1, t]),
         "consensus": float(h["consensus"][-1, t]),
         **({"centralized_nmse": float(ch["nmse"][-1, t])} if ch is not None else {})}
        for t in range(T)])
    write_text(out / "history.json", json.dumps({
        "seeds": list(dist.seeds),
        "distributed": {k: plain(torch.as_tensor(v)) for k, v in dist.history.items()},
        "centralized": {k: plain(torch.as_tensor(v)) for k, v in ch.items()} if ch is not None else None}))
