"""Symmetric NMF's site run in the app (:mod:`.site`): one party's columns of the similarity on
:func:`~ppdnmf_torch.models.symnmf.site.fit_symnmf_site` (``task=symnmf symnmf/variant=agents``),
and its own run folder (docs/DEPLOYMENT.md, "Symmetric NMF across agents").

The public description of a symmetric-NMF site: ``site.columns`` (every agent's node count
``|S_i|``; ``n`` is their sum), ``site.parts`` (every agent's nodes ``S_i``; default: contiguous
blocks in node order, agent 0 the first ``|S_0|`` nodes), the agents' graph (``graph=``), the
model's settings (``agents.*``, ``rank``), the exchange and the ``seed``. The site's file holds
its agents' columns ``X[:, S_i]`` side by side, ``(n, sum of its agents' |S_i|)``.

Besides the exchange's messages, the history's metrics cross the sites every outer iteration:
each site's sum of its agents' copies ``U_i`` (the mean copy's all-reduce), its metric sums and
the adaptive ``lambda``'s three sums. Under ``exchange=secagg`` (the default) they are masked
(:class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums`: only the totals are revealed); under
``quantized`` or ``plain`` they cross in the clear, and the adaptive ``lambda``'s sums need
``agents.aggregation=plain`` (docs/DEPLOYMENT.md, "Symmetric NMF across agents", lists every number).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import torch

from ..checkpoint import write_atomically
from ..errors import ConfigError, DataError, PPDNMFError
from ..exchange.aggregation import AGGREGATION_KINDS
from ..distributed.site import own_agents, site_owner
from ..models.symnmf.run import AGENTS_SCALAR_TAGS
from .outputs import write_history_csv, write_text
from .progress import Progress
from .tasks import _common as common
from .tasks import task_of

__all__ = ["symnmf_site_data", "own_similarity_columns", "run_symnmf_site", "format_symnmf_site", "public_parts"]

#: the rank fit's keywords the app does not take from the ``agents`` section
_NOT_FROM_AGENTS = ("exchange", "min_degree")


def symnmf_site_data(raw: dict, opts) -> dict:
    """The run's ``data`` section for a site: the site's file as a ``similarity`` preset (its own
    columns; no labels: a clustering score needs every node's label and every site's ``U_i``)."""
    if raw.get("variant") != "agents":
        raise ConfigError("a site runs the fit across agents; add symnmf/variant=agents",
                          key="symnmf/variant")
    given = dict(raw.get("data") or {})
    if given.get("labels_path"):
        raise ConfigError("a site's run scores no clustering (it would need every node's label "
                          "and every site's factors); leave it out", key="data.labels_path")
    return dict(given, preset="similarity", path=opts.data)


def public_parts(opts, n_agents: int) -> list:
    """Every agent's nodes ``S_i`` (lists of node ids, public): ``site.parts``, or contiguous blocks of
    ``site.columns`` nodes in node order; checked to cover the ``n = sum(site.columns)`` nodes once."""
    columns = [int(c) for c in opts.columns]
    if len(columns) != n_agents:
        raise ConfigError(f"{len(columns)} counts, the run has agents.n_agents={n_agents}",
                          key="site.columns")
    n = sum(columns)
    parts = getattr(opts, "parts", None)
    if parts is None:
        starts = [sum(columns[:i]) for i in range(n_agents)]
        return [list(range(s, s + c)) for s, c in zip(starts, columns)]
    if (not isinstance(parts, list) or len(parts) != n_agents
            or any(not isinstance(p, list) or any(not isinstance(j, int) or isinstance(j, bool) for j in p)
                   for p in parts)):
        raise ConfigError(f"give every agent's node ids, {n_agents} lists of integers", key="site.parts")
    sizes = [len(p) for p in parts]
    if sizes != columns:
        raise ConfigError(f"the agents hold {sizes} nodes, site.columns says {columns}", key="site.parts")
    if sorted(j for p in parts for j in p) != list(range(n)):
        raise ConfigError(f"must cover the nodes 0..{n - 1} (n = sum of site.columns) exactly once",
                          key="site.parts")
    return [list(p) for p in parts]


def _check_penalty_sums(cfg) -> None:
    """The adaptive penalty's three sums cross the sites in a masked all-reduce under
    ``exchange=secagg`` (``agents.aggregation`` null, ``secagg`` or ``plain``), in a plain one
    otherwise: refused there unless ``agents.aggregation=plain`` says so (as
    :func:`~ppdnmf_torch.models.symnmf.distributed.fit_symnmf_rank` refuses it, here with the keys
    that fix it)."""
    a = cfg.agents
    if a.penalty != "adaptive":
        return
    kind = cfg.exchange.kind
    resolved = a.aggregation if a.aggregation is not None else (
        kind if kind in AGGREGATION_KINDS and a.n_agents > 1 else "plain")
    if resolved != "plain" and not (kind == "secagg" and resolved == "secagg"):
        why = "" if a.aggregation is not None else f" (null takes the exchange's kind, {kind!r})"
        raise ConfigError(f"{resolved!r}{why} has no protocol across sites; the adaptive "
                          "penalty's three sums cross the sites in a plain all-reduce (3 numbers per site and outer "
                          "iteration): accept that with agents.aggregation=plain, or fix lambda with "
                          "agents.penalty=<number>", key="agents.aggregation")


def own_similarity_columns(cfg, opts, rank: int, world: int, Z: torch.Tensor) -> dict:
    """This site's columns ``Z`` checked against the public description before connecting:
    ``{"X": Z, "parts", "n", "agents"}`` (a wrong shape is one :class:`DataError` naming ``site.data``)."""
    _check_penalty_sums(cfg)
    N = cfg.agents.n_agents
    parts = public_parts(opts, N)
    n = sum(len(p) for p in parts)
    try:
        agents = own_agents(site_owner(opts.assignment, N, world), rank)
    except PPDNMFError as exc:
        raise exc.renamed({"assignment": "site.assignment"}) from None
    want = (n, sum(len(parts[i]) for i in agents))
    if Z.dim() != 2 or tuple(Z.shape) != want:
        raise DataError(f"has shape {tuple(Z.shape)}, this site's agents {agents} hold {want} by the public "
                        f"description (n = {n} nodes, columns {[len(parts[i]) for i in agents]})",
                        key=f"site.data ({opts.data})")
    return {"X": Z, "parts": parts, "n": n, "agents": agents}


def _fit_kwargs(cfg, out: Path, resume: bool) -> dict:
    a = {k: v for k, v in asdict(cfg.agents).items() if k not in _NOT_FROM_AGENTS}
    return dict(a, exchange=cfg.exchange, min_degree=cfg.graph.min_degree, seed=cfg.seed,
                dtype=getattr(torch, cfg.dtype), threads=cfg.threads, checkpoint_dir=out / "checkpoints",
                checkpoint_every=cfg.checkpoint_every, resume=resume)


def _padded(parts: list, n: int) -> torch.Tensor:
    m = max(len(p) for p in parts)
    return torch.tensor([list(p) + [n] * (m - len(p)) for p in parts], dtype=torch.long)


def write_own_symnmf_factors(path: Path, own: dict, rank: int) -> None:
    """``factors.pt`` of a site: ``rank``, ``agents (n_own,)``, ``U (n_own, n, r)`` (its agents'
    copies), ``V (n_own, m, r)`` (their ``V_i``, padded rows zero), ``parts (n_own, m)`` (their
    ``S_i``, padded with ``n``)."""
    factors = {"rank": torch.tensor(int(rank)), "agents": torch.tensor(own["agents"], dtype=torch.long),
               "U": own["U"].detach().cpu(), "V": own["V"].detach().cpu(), "parts": own["parts"].detach().cpu()}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(str(path), lambda fh: torch.save(factors, fh))


def _history(raw: dict) -> dict:
    """The site's history as lists of floats (one per outer iteration; one trial)."""
    return {k: [float(torch.as_tensor(v).reshape(-1)[0]) for v in vals] for k, vals in raw.items() if len(vals)}


def run_symnmf_site(cfg, opts, own: dict, out: Path, comm, logger, *, resume: bool = False, callback=None) -> dict:
    """This site's run: ``own`` (:func:`own_similarity_columns`) on ``comm``; writes ``factors.pt``
    (:func:`write_own_symnmf_factors`), ``history.csv``/``.json`` and the TensorBoard scalars (the
    same on every site: per-site sums reduced), and returns the summary with a ``site`` section."""
    from ..models.symnmf.site import fit_symnmf_site

    a = cfg.agents
    graph = common.make_graphs(cfg.graph, a.n_agents, [cfg.seed])[0]
    r = int(cfg.rank or 20)
    label = f"SymNMF site {comm.rank} of {comm.world_size} ({cfg.exchange.kind})"
    with Progress(cfg.progress, a.max_iter, label, interval=cfg.progress_interval, step="iteration") as bar:

        def cb(k, metrics):
            values = {tag: float(torch.as_tensor(metrics[key]).reshape(-1)[0])
                      for key, tag in AGENTS_SCALAR_TAGS.items() if key in metrics}
            logger.scalars(k, values)
            bar.update(k, {"E": values.get("symnmf/E"), "lambda": values.get("symnmf/lambda")})
            return bool(callback(SimpleNamespace(k=k, iteration=k, metrics=metrics))) if callback else False

        t0 = time.perf_counter()
        fit_ = fit_symnmf_site(comm, own["X"], r, n=own["n"], parts=_padded(own["parts"], own["n"]),
                               graph=graph, assignment=opts.assignment, callback=cb,
                               **_fit_kwargs(cfg, out, resume))
    seconds = time.perf_counter() - t0
    write_own_symnmf_factors(out / "factors.pt", fit_.own, comm.rank)
    hist = _history(fit_.history)
    write_history_csv(out / "history.csv", {k: torch.tensor(v, dtype=torch.float64) for k, v in hist.items()})
    write_text(out / "history.json", json.dumps(hist, indent=2))
    last = {k: v[-1] for k, v in hist.items()}
    n_iter = len(hist.get("E", []))
    logger.finished(None, None, hparams={"name": cfg.name, "variant": "agents (site)", "rank": r, "n": own["n"],
                                         "penalty": str(a.penalty), "seed": cfg.seed},
                    metrics={"E": last.get("E"), "n_iter": n_iter, "wall_time": seconds},
                    config_text="```\n" + json.dumps(task_of(cfg).config_to_dict(cfg), indent=2, default=str) + "\n```")
    return {"task": "symnmf", "variant": "agents", "name": cfg.name, "data": "similarity", "seed": cfg.seed,
            "device": str(comm.device), "dtype": cfg.dtype, "rank": r, "n": own["n"], "n_agents": a.n_agents,
            "graph": cfg.graph.kind, "exchange": cfg.exchange.kind, "penalty": str(a.penalty), "trials": 1,
            "n_iter": [n_iter], "E": [last.get("E")], "objective": [last.get("objective")],
            "uv_dist": [last.get("uv_dist")], "consensus": [last.get("consensus")], "lam": [last.get("lambda")],
            "wall_time": {"fit": seconds}, "out_dir": str(out),
            "site": {"rank": comm.rank, "world": comm.world_size, "agents": fit_.own["agents"],
                     "columns": list(opts.columns), "sent": dict(comm.sent), "share": "sums"}}


def format_symnmf_site(summary: dict) -> str:
    """The lines a symmetric-NMF site prints at the end."""
    s = summary
    site = s["site"]
    return "\n".join([
        f"SymNMF site {site['rank']} of {site['world']} (agents {site['agents']} of {s['n_agents']}; n = {s['n']}, "
        f"rank {s['rank']}; {s['graph']} graph, exchange {s['exchange']}, penalty {s['penalty']})",
        f"  E {s['E'][0]:.6g} | consensus {s['consensus'][0]:.3g} | iterations {s['n_iter'][0]}",
        f"wall time: fit {s['wall_time']['fit']:.2f} s ({s['device']}, {s['dtype']})",
        f"outputs: {s['out_dir']}"])
