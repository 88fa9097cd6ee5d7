"""The files a run writes into its folder, and the summary the CLI prints.

* ``config.yaml``: the validated config (after defaults), as run;
* ``factors.pt``: ``torch.save`` of a dict of tensors: ``X (N, L, K)``, ``Y`` (list of N
  ``(K, M_i)``), ``U (N, L, K)``, ``X_mean (L, K)``, ``columns (N,)``, ``edges (E, 2)``,
  and ``centralized_X (L, K)``, ``centralized_Y (K, M)`` with the baseline;
* ``history.csv``: one row per BCD iteration, every scalar metric (``nmse``,
  ``consensus``, ``objective``, the ADMM residuals, step times, mean ADMM iteration
  counts, ``centralized_nmse``, ``centralized_objective``, cumulative ``crypto_*`` costs);
* ``history.json``: the full histories, ``{"distributed": ..., "centralized": ...}``;
* ``summary.json``: final metrics, wall times, device, sizes, exchange costs.
"""
from __future__ import annotations

import csv
import json
import math
import platform
from pathlib import Path

import torch

from ._utils import plain_number
from .config import exchange_to_dict
from .exchange.costmodel import COUNT_KEYS

__all__ = ["write_yaml", "write_factors", "write_histories", "write_summary", "summary_of", "format_summary",
           "plain", "numeric"]

#: the exchange's counters written as integers in history.csv
_COUNT_COLUMNS = COUNT_KEYS + ("key_pairs",)


def plain(v):
    """JSON-friendly copy of history values (tensors -> lists, non-finite floats -> strings)."""
    if isinstance(v, torch.Tensor):
        return v.tolist()
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
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=columns or ["iteration"], restval="")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def write_yaml(path: Path, d: dict) -> None:
    import yaml  # PyYAML, a dependency of omegaconf; plain data only

    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(d, fh, sort_keys=False, default_flow_style=None)


def write_factors(path: Path, result, central, graph) -> None:
    """``factors.pt``: every agent's factors, the split, the graph's edges, the baseline's factors."""
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
    torch.save(factors, path)


def write_histories(out: Path, result, central) -> None:
    """``history.csv`` and ``history.json``."""
    _write_csv(out / "history.csv", history_rows(result, central))
    with open(out / "history.json", "w", encoding="utf-8") as fh:
        json.dump({"distributed": plain(result.history),
                   "centralized": plain(central.history) if central is not None else None}, fh)


def summary_of(cfg, inputs, fits, out: Path) -> dict:
    """The run's summary (final metrics, wall times, device, sizes, costs); ``wall_time.total``
    is set when the run ends."""
    result, central, s, e = fits.result, fits.central, cfg.solver, cfg.exchange

    def both(fn):
        return {"distributed": fn(result), "centralized": fn(central) if central is not None else None}

    L, M = inputs.Z.shape
    return {
        "name": cfg.name,
        "nmse": both(lambda r: r.nmse),
        "consensus": result.consensus,
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
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(plain(summary), fh, indent=2)


def format_summary(summary: dict) -> str:
    """Human-readable lines of a run's summary (what the CLI prints)."""
    nm, wt = summary["nmse"], summary["wall_time"]
    central = nm.get("centralized")
    lines = [
        f"final NMSE after {summary['n_iter']['distributed']} BCD iterations: "
        f"distributed {nm['distributed']:.6g}"
        + (f" | centralized {central:.6g}" if central is not None else "")
        + f" | consensus {summary['consensus']:.3g}",
        f"wall time: distributed {wt['distributed']:.2f} s"
        + (f", centralized {wt['centralized']:.2f} s" if wt.get("centralized") is not None else "")
        + f" ({summary['device']}, {summary['dtype']}, exchange {summary['exchange']['kind']})",
    ]
    costs = summary.get("costs") or {}
    if costs:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in costs.items())
        lines.append(f"exchange costs: {shown}")
    lines.append(f"outputs: {summary['out_dir']}")
    return "\n".join(lines)
