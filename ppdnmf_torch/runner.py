"""One run of the app, without Hydra: :func:`run` turns a :class:`~ppdnmf_torch.config.RunConfig`
into data, a column split, a graph, a distributed fit (and the centralized baseline), and
writes everything into an output folder.

What :func:`run` writes into ``out_dir``:

* ``config.yaml``: the validated config (after defaults), as run;
* ``factors.pt``: ``torch.save`` of a dict of tensors: ``X (N, L, K)``, ``Y`` (list of N
  ``(K, M_i)``), ``U (N, L, K)``, ``X_mean (L, K)``, ``columns (N,)``, ``edges (E, 2)``,
  and ``centralized_X (L, K)``, ``centralized_Y (K, M)`` with the baseline;
* ``history.csv``: one row per BCD iteration, every scalar metric (``nmse``,
  ``consensus``, ``objective``, the ADMM residuals, step times, mean ADMM iteration
  counts, ``centralized_nmse``, ``centralized_objective``, cumulative ``crypto_*`` costs);
* ``history.json``: the full histories, ``{"distributed": ..., "centralized": ...}``;
* ``summary.json``: final metrics, wall times, device, sizes, exchange costs;
* ``tb/``: TensorBoard events (``logger.kind=tensorboard``).

The runner never prints; the progress bar (tqdm, stderr) is the only terminal output,
and only when asked for. :mod:`ppdnmf_torch.cli` prints the summary.
"""
from __future__ import annotations

import csv
import json
import logging
import math
import platform
import time
from pathlib import Path

import torch

from . import data as data_mod
from ._utils import ConfigError, DataError, GraphError, PPDNMFError, plain_number, resolve_device, resolve_dtype
from .api import FitResult, fit, fit_centralized
from .config import RunConfig, to_dict
from .exchange import make_exchange
from .exchange.costmodel import COUNT_KEYS
from .graph import Graph, make_graph
from .solver import RunInterrupted

__all__ = ["run", "load_data", "make_split", "build_graph", "format_summary"]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------


def _prefixed(exc: Exception, section: str) -> Exception:
    """The same error with the config section in front: ``path: ...`` -> ``data.path: ...``."""
    msg = str(exc)
    head = msg.split(":", 1)[0]
    if head == section or head.startswith(section + "."):
        text = msg
    elif head.isidentifier():
        text = f"{section}.{msg}"
    else:
        text = f"{section}: {msg}"
    new = type(exc)(text)
    new.__dict__.update(exc.__dict__)
    return new


def load_data(cfg: RunConfig) -> tuple[torch.Tensor, tuple[int, int] | None]:
    """``Z (L, M)`` float64 on the CPU, and the image shape (or None) of ``cfg.data``."""
    d = cfg.data
    try:
        if d.kind == "synthetic":
            Z = data_mod.synthetic(**d.synthetic_kwargs(), seed=cfg.seed).Z
        else:
            kw = {"delimiter": d.delimiter if d.delimiter is not None else ","} if d.kind == "csv" else {}
            Z = data_mod.load_matrix(d.kind, d.path, **kw)
    except (ConfigError, DataError) as exc:
        raise _prefixed(exc, "data") from None
    shape = tuple(d.image_shape) if d.image_shape is not None else None
    if shape is None and d.kind == "cbcl":
        shape = tuple(data_mod.CBCL_SHAPE)
    if shape is not None and shape[0] * shape[1] != Z.shape[0]:
        raise ConfigError(
            f"data.image_shape: {shape[0]}x{shape[1]} = {shape[0] * shape[1]} pixels, but the data has "
            f"L = {Z.shape[0]} rows"
        )
    if cfg.solver.rank > Z.shape[0]:
        raise ConfigError(f"solver.rank: K = {cfg.solver.rank} is larger than L = {Z.shape[0]} (rows of the data)")
    return Z, shape


def make_split(cfg: RunConfig, M: int) -> list[int]:
    """Columns per agent from ``cfg.data.split`` (errors name ``data.split.<key>``)."""
    s = cfg.data.split
    N = cfg.n_agents
    if s.counts is not None:
        if len(s.counts) != N:
            raise ConfigError(f"data.split.counts: got {len(s.counts)} counts but n_agents = {N}")
        if sum(s.counts) != M:
            raise ConfigError(f"data.split.counts: sum to {sum(s.counts)} but the data has M = {M} columns")
        return list(s.counts)
    if M < N:
        raise ConfigError(f"n_agents: {N} agents, but the data has only M = {M} columns (at least one each)")
    try:
        return data_mod.split_counts(M, N, lo=s.lo, hi=s.hi, seed=cfg.seed)
    except ConfigError as exc:
        raise _prefixed(exc, "data.split") from None


def build_graph(cfg: RunConfig) -> Graph:
    """The communication graph of ``cfg.graph`` with ``cfg.n_agents`` agents."""
    g = cfg.graph
    try:
        return make_graph(g.kind, cfg.n_agents, seed=cfg.seed, **g.params())
    except (ConfigError, GraphError) as exc:
        raise _prefixed(exc, "graph") from None


def _solver_kwargs(cfg: RunConfig, device, dtype) -> dict:
    s = cfg.solver
    kw = dict(mu=s.mu, eta=s.eta, bcd_iters=s.bcd_iters, x_iters=s.x_iters, y_iters=s.y_iters, tol=s.tol,
              penalty=s.penalty, consensus_form=s.consensus_form, fuse=s.fuse, negative=cfg.data.negative,
              seed=cfg.seed, device=device, dtype=dtype)
    if s.admm_tol is not None:
        kw["admm_tol"] = s.admm_tol
    kw.update(penalty_schedule=s.penalty_schedule, init=s.init, init_seed=s.init_seed, y_solver=s.y_solver)
    return kw


def _plain(v):
    """JSON-friendly copy of history values (tensors -> lists)."""
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _numeric(costs: dict | None) -> dict:
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


def _history_rows(dist: FitResult, central: FitResult | None) -> list[dict]:
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


def _write_yaml(path: Path, d: dict) -> None:
    import yaml  # PyYAML, a dependency of omegaconf; plain data only

    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(d, fh, sort_keys=False, default_flow_style=None)


def _progress_bar(enabled: bool, total: int, desc: str):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    # disable=None: tqdm switches itself off when stderr is not a terminal
    return tqdm(total=total, desc=desc, unit="it", leave=True, dynamic_ncols=True, disable=None)


def _sample_columns(M: int, n: int) -> list[int]:
    """``n`` column indices spread evenly from the first column to the last."""
    n = max(1, min(n, M))
    if n == 1:
        return [0]
    return sorted({round(i * (M - 1) / (n - 1)) for i in range(n)})


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


#: the exchange's counters written as integers in history.csv
_COUNT_COLUMNS = COUNT_KEYS + ("key_pairs",)

#: errors raised by the Python API name its keywords; a config run names its keys
_CONFIG_NAMES = {
    "g_bits:": ("exchange.g_bits:", (("use g_bits >=", "use exchange.g_bits >="),)),
    "key_bits/n_max:": ("exchange.key_bits/exchange.n_max:", (
        ("use key_bits >=", "use exchange.key_bits >="), ("lower n_max", "lower exchange.n_max"),
        ("(or g_bits)", "(or exchange.g_bits)"), ("; n_max <=", "; exchange.n_max <="))),
    "Z:": ("data:", (("Pass negative='clip' or 'shift' (or 'allow' to factorize as is)",
                      "Set data.negative=clip or shift (or allow to factorize as is)"),)),
}


def _config_names(exc: Exception) -> Exception:
    """``exc`` with the API's names in its message replaced by the config's keys."""
    msg = str(exc)
    for head, (key, hints) in _CONFIG_NAMES.items():
        if msg.startswith(head):
            text = key + msg[len(head):]
            for old, new in hints:
                text = text.replace(old, new)
            new_exc = type(exc)(text)
            new_exc.__dict__.update(exc.__dict__)
            return new_exc
    return exc


def run(cfg: RunConfig, out_dir, *, progress: bool | None = None, callback=None, resume_from=None) -> dict:
    """Run one experiment and write its outputs into ``out_dir``.

    Parameters
    ----------
    cfg : RunConfig
        Validated here again (so a hand-built config gets the same checks).
    out_dir : str or os.PathLike
        Created if missing.
    progress : bool, optional
        Show tqdm progress bars on stderr (default ``cfg.progress``; never on a non-terminal).
    callback : callable, optional
        Extra ``callback(info)`` of the distributed fit, called after the logger's.
    resume_from : str or os.PathLike, optional
        Checkpoint file or folder of this same run to continue from (bit-identical to an
        uninterrupted run). Checkpoints are written to ``out_dir/checkpoints`` every
        ``cfg.checkpoint_every`` BCD iterations and on Ctrl-C.

    Returns
    -------
    dict
        The summary also written to ``summary.json``.

    Raises
    ------
    PPDNMFError
        (ConfigError, DataError, GraphError, CodecRangeError, NumericalError) for bad
        input or a failed run; messages name the config's keys (``exchange.g_bits``, not
        the API's ``g_bits``).
    """
    try:
        return _run(cfg, out_dir, progress=progress, callback=callback, resume_from=resume_from)
    except PPDNMFError as exc:
        mapped = _config_names(exc)
        if mapped is exc:
            raise
        raise mapped.with_traceback(exc.__traceback__) from None


def _run(cfg: RunConfig, out_dir, *, progress, callback, resume_from) -> dict:
    t_start = time.perf_counter()
    cfg.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if resume_from is None:
        # a fresh run in a used folder: the old run's summary would mark this one finished
        # (the CLI refuses to resume a folder with a summary.json)
        (out / "summary.json").unlink(missing_ok=True)
    _write_yaml(out / "config.yaml", to_dict(cfg))
    show = cfg.progress if progress is None else bool(progress)

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype)
    Z, image_shape = load_data(cfg)
    L, M = Z.shape
    counts = make_split(cfg, M)
    graph = build_graph(cfg)
    log.info("data %s: Z %d x %d; %d agents, %d edges (%s graph); columns per agent %s",
             cfg.data.kind, L, M, graph.n_agents, graph.n_edges, cfg.graph.kind, counts)

    tb = None
    if cfg.logger.kind == "tensorboard":
        from .tensorboard import TensorBoardLogger

        tb = TensorBoardLogger(out / "tb", flush_secs=cfg.logger.flush_secs)
    try:
        common = _solver_kwargs(cfg, device, dtype)
        s = cfg.solver

        # centralized baseline first (fast): its curve is in TensorBoard from the start
        central, t_central = None, 0.0
        if cfg.centralized:
            # one agent has no neighbours: its penalty cap never enters the updates
            g_c = s.g_max if isinstance(s.g_max, float) else float(s.g_max[0])
            bar = _progress_bar(show, s.bcd_iters, "centralized")

            def cb_central(info):
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(nmse=f"{info.metrics['nmse']:.4g}", refresh=False)
                return False

            t0 = time.perf_counter()
            try:
                central = fit_centralized(Z, s.rank, g_max=g_c, callback=cb_central, **common)
            except RunInterrupted as exc:
                # the baseline keeps no checkpoints: say so, rather than "checkpoint: None"
                raise KeyboardInterrupt(
                    f"during the centralized baseline (after its BCD iteration {exc.bcd_done}), before the "
                    "distributed run started: there is nothing to resume; run again (centralized=false skips "
                    "the baseline)"
                ) from None
            finally:
                if bar is not None:
                    bar.close()
            t_central = time.perf_counter() - t0
            if tb is not None:
                tb.log_centralized(central.history)

        # the distributed run; the exchange is built here so that its costs can be read
        # after every BCD iteration (fit accepts an Exchange instance)
        e = cfg.exchange
        try:
            exch = make_exchange(e.kind, protocol=e.protocol, n_max=e.n_max, key_bits=e.key_bits,
                                 g_bits=e.g_bits, **e.options())
        except ConfigError as exc:
            raise _prefixed(exc, "exchange") from None
        bar = _progress_bar(show, s.bcd_iters, f"PPDNMF ({e.kind})")
        c_hist = central.history.get("nmse", []) if central is not None else []

        def cb(info):
            if tb is not None:
                tb.callback(info)
            # fit hands the exchange's costs to the callback: cumulative, and the records of
            # this BCD iteration's ADMM iterations
            costs = _numeric(info.costs)
            records = info.iteration_costs
            if tb is not None:
                if costs:
                    tb.log_costs(costs, info.iteration)
                tb.log_iteration_costs(records, s.x_iters)
            if bar is not None:
                post = {"nmse": f"{info.metrics['nmse']:.4g}", "cons": f"{info.metrics['consensus']:.2g}"}
                if info.iteration <= len(c_hist):
                    post["central"] = f"{c_hist[info.iteration - 1]:.4g}"
                bar.update(1)
                bar.set_postfix(post, refresh=False)
            return bool(callback(info)) if callback is not None else False

        t0 = time.perf_counter()
        try:
            result = fit(Z, graph, s.rank, columns=counts, g_max=s.g_max, exchange=exch, callback=cb,
                         checkpoint_dir=out / "checkpoints", checkpoint_every=cfg.checkpoint_every,
                         resume_from=resume_from, **common)
        finally:
            if bar is not None:
                bar.close()
            try:
                exch.close()
            except Exception:  # noqa: BLE001 - fit closed it already; a second close must not mask errors
                pass
        t_dist = time.perf_counter() - t0
        costs = _numeric(result.costs)

        # files
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
        torch.save(factors, out / "factors.pt")
        _write_csv(out / "history.csv", _history_rows(result, central))
        with open(out / "history.json", "w", encoding="utf-8") as fh:
            json.dump({"distributed": _plain(result.history),
                       "centralized": _plain(central.history) if central is not None else None}, fh)

        summary = {
            "name": cfg.name,
            "nmse": {"distributed": result.nmse, "centralized": central.nmse if central is not None else None},
            "consensus": result.consensus,
            "objective": {"distributed": result.history["objective"][-1],
                          "centralized": central.history["objective"][-1] if central is not None else None},
            "n_iter": {"distributed": result.n_iter, "centralized": central.n_iter if central is not None else None},
            "converged": {"distributed": result.converged,
                          "centralized": central.converged if central is not None else None},
            "wall_time": {
                "distributed": t_dist,
                "centralized": t_central if central is not None else None,
                "x_steps": float(sum(result.history.get("time_x", []))),
                "y_steps": float(sum(result.history.get("time_y", []))),
                "total": None,  # set below
            },
            "device": str(device),
            "dtype": cfg.dtype,
            "sizes": {"L": L, "M": M, "K": s.rank, "n_agents": graph.n_agents, "n_edges": graph.n_edges,
                      "columns": list(result.columns)},
            "exchange": {"kind": e.kind, "protocol": e.protocol, "n_max": e.n_max, "key_bits": e.key_bits,
                         "g_bits": e.g_bits},
            "costs": costs,
            "bytes_per_edge": _plain(result.costs.get("bytes_per_edge")) if isinstance(result.costs, dict) else None,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "out_dir": str(out.resolve()),
        }

        if tb is not None:
            tb.log_timing(result.history)  # crypto/ costs were logged after every BCD iteration
            if image_shape is not None and cfg.logger.images:
                recons = {"distributed": result.reconstruction()}
                if central is not None:
                    recons["centralized"] = central.reconstruction()
                tb.log_images(result.X_mean, image_shape, Z=Z.to(result.X.dtype), reconstructions=recons,
                              columns=_sample_columns(M, cfg.logger.n_samples), step=result.n_iter,
                              scale=cfg.logger.image_scale)
            tb.log_text("config", "```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```")
            tb.log_hparams(_hparams(cfg), {
                "nmse_distributed": result.nmse,
                **({"nmse_centralized": central.nmse} if central is not None else {}),
                "consensus": result.consensus,
                "wall_time": t_dist,
            })
    finally:
        if tb is not None:
            tb.close()

    summary["wall_time"]["total"] = time.perf_counter() - t_start
    with open(out / "summary.json", "w", encoding="utf-8") as fh:
        json.dump(_plain(summary), fh, indent=2)
    return summary


def _hparams(cfg: RunConfig) -> dict:
    s, e = cfg.solver, cfg.exchange
    return {
        "name": cfg.name, "seed": cfg.seed, "n_agents": cfg.n_agents, "data": cfg.data.kind,
        "graph": cfg.graph.kind, "rank": s.rank, "mu": s.mu, "eta": s.eta,
        "g_max": s.g_max if isinstance(s.g_max, float) else str(s.g_max),
        "bcd_iters": s.bcd_iters, "x_iters": s.x_iters, "y_iters": s.y_iters, "tol": s.tol,
        "penalty": s.penalty, "consensus_form": s.consensus_form, "penalty_schedule": s.penalty_schedule,
        "init": s.init, "y_solver": s.y_solver, "exchange": e.kind,
        "protocol": e.protocol, "n_max": e.n_max, "key_bits": e.key_bits, "dtype": cfg.dtype,
        "device": cfg.device,
    }


def format_summary(summary: dict) -> str:
    """Human-readable lines of a :func:`run` summary (what the CLI prints)."""
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
