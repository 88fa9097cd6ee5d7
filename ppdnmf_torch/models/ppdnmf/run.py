"""One PPDNMF run behind :func:`~.api.fit` and :func:`~.api.fit_trials` (and, for what a rank
shares with them, :func:`~.distributed.fit_rank`): the solver's parameters and the exchange
made from the spec (:func:`prepare`), the privacy warnings and the codec's range checked before
any work (:func:`warn_degree_one`, :func:`warn_sum_leak`, :func:`preflight`), and the run
itself with its checkpoints, resume and lock (:func:`run`), which warns when the result means
nothing.
"""
from __future__ import annotations

import os
import warnings

import torch

from ..._utils import caller_stacklevel
from ...checkpoint import (PREFIX, CheckpointError, Checkpointer, check_payload, checkpoint_files,
                           checkpoint_iteration, fingerprint, load_checkpoint, unpack_history)
from ...diagnostics import degenerate_reasons, likely_cause, x_sketch
from ...errors import ConfigError, DegenerateResultWarning, DegreeOneWarning, SumLeakWarning
from ...exchange import exchange_spec, make_exchange
from ...exchange.base import Exchange
from ...folderlock import FolderLock
from ...penalties import cap_bounds, sum_leak_message
from .config import FitOptions, SolverConfig
from .problem import check_rank, check_run_size
from .solver import SolverParams, make_sampler, restore_state, run_bcd

__all__ = ["prepare", "start_seed", "warn_degree_one", "warn_sum_leak", "preflight", "run", "lock_checkpoint_dir"]


def prepare(solver: SolverConfig, options: FitOptions, L: int):
    """The solver's parameters and the run's exchange, made from the spec (a given
    :class:`~ppdnmf_torch.exchange.Exchange` is used as it is, its settings checked against
    the flat keywords: nothing is dropped). ``L``: the data's rows (``rank <= L``).

    Returns
    -------
    params : SolverParams
    exchange : Exchange
        Owned by the caller from here on (closed by :func:`run`, or on an error before it).
    """
    check_rank(solver.rank, L)
    params = SolverParams.of(solver)
    spec = exchange_spec(options.exchange, protocol=options.protocol, n_max=options.n_max,
                         key_bits=options.key_bits, g_bits=options.g_bits, options=options.exchange_options)
    described = spec.spec if isinstance(spec, Exchange) else spec
    if params.x_solver != "admm" and getattr(described, "kind", None) != "plain":
        kind = getattr(described, "kind", None) or type(spec).__name__
        if isinstance(spec, Exchange):
            spec.close()  # fit owns the exchange
        raise ConfigError(f"exchange: {{x_solver}}={params.x_solver!r} passes a token and sends no secure sums, "
                          f"so the exchange {kind!r} would go unused; use exchange='plain'")
    return params, (spec if isinstance(spec, Exchange) else make_exchange(spec))


def start_seed(init_seed, seed: int) -> int:
    """The seed of the seeded start: ``init_seed``, or the run's ``seed`` when None."""
    return int(seed if init_seed is None else init_seed)


def warn_degree_one(exch, graphs) -> None:
    """:class:`~ppdnmf_torch.errors.DegreeOneWarning` naming the agents with one neighbour, for the
    integer (secure) exchange kinds: there the sums an agent obtains are its neighbour's term."""
    if getattr(exch, "codec", None) is None:
        return
    found = [(t, a) for t, g in enumerate(graphs) for a, d in enumerate(g.degree.tolist()) if d == 1]
    if not found:
        return
    names = [str(a) if len(graphs) == 1 else f"{a} (trial {t})" for t, a in found]
    shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
    warnings.warn(
        f"agents [{shown}] have a single neighbour: each learns that neighbour's U_j exactly from its "
        "sums; min_degree=2 refuses such graphs (docs/THREAT_MODEL.md)", DegreeOneWarning,
        stacklevel=caller_stacklevel())


def warn_sum_leak(exch, params, caps, degrees) -> None:
    """:class:`~ppdnmf_torch.errors.SumLeakWarning` (once, at the user's line) when an integer
    (secure) exchange runs the ADMM X-step under a schedule whose weights differ across a
    receiver's neighbours: ``adaptive``, or ``paper`` with unequal caps in a trial. ``caps (T, N)``,
    ``degrees``: one LongTensor ``(N,)`` per trial (receivers of degree >= 2 are at stake; degree 1
    has its own warning, :class:`~ppdnmf_torch.errors.DegreeOneWarning`)."""
    if getattr(exch, "codec", None) is None or params.x_solver != "admm":
        return
    message = sum_leak_message(params.penalty_schedule, caps, degrees)
    if message is not None:
        warnings.warn(message, SumLeakWarning, stacklevel=caller_stacklevel())


def preflight(exch, blocks, caps, degree, params=None):
    """Key size vs ``n_max``: refuse a run the codec cannot hold, before any work starts.

    With ``penalty_schedule="adaptive"`` or ``"agreed"`` the caps can grow during the run: the bound
    checked is the largest they can reach (:func:`~ppdnmf_torch.penalties.cap_bounds`).
    """
    codec = getattr(exch, "codec", None)
    if codec is None:
        return
    zmax = max(float(b.abs().max()) for b in blocks)
    caps = torch.as_tensor(caps, dtype=torch.float64)
    linked = caps[torch.as_tensor(degree) > 0]
    highest = caps if params is None else cap_bounds(caps, params.penalty_schedule)
    codec.preflight(value_scale=zmax, g_max=float(highest.max()),
                    max_degree=int(degree.max()) if degree.numel() else 0,
                    g_min=float(linked.min()) if linked.numel() else None)


def run(problem, params: SolverParams, exch, options: FitOptions, *, single: bool):
    """Run Algorithm 1 on ``problem`` with ``exch`` (bound here, closed at the end whatever
    happens), with ``options``' callback, checkpoints and resume.

    Parameters
    ----------
    problem : Problem
    params : SolverParams
    exch : Exchange
    options : FitOptions
        ``callback`` (its ``info.metrics`` as floats when ``single``), ``checkpoint_dir``
        (locked for the run), ``checkpoint_every`` and ``resume_from``.
    single : bool
        One trial (:func:`~.api.fit`) rather than a batch.

    Returns
    -------
    state, history, info, costs
        The final :class:`~.solver.SolverState`, the batched history, ``run_bcd``'s info
        (``n_iter``, ``converged``) and the exchange's costs.
    """
    callback, checkpoint_dir, resume_from = options.callback, options.checkpoint_dir, options.resume_from
    dtype, device = problem.Z.dtype, problem.Z.device
    # hashing the data costs a pass over it: only runs that write or read checkpoints need it
    fp = fingerprint(problem, params, exch) if (checkpoint_dir is not None or resume_from is not None) else ""
    state = sampler = history = None
    if resume_from is not None:
        payload = load_checkpoint(resume_from)
        if payload["fingerprint"] != fp:
            raise CheckpointError(
                f"resume_from: checkpoint {payload['path']!r} belongs to a different run (data, graph, "
                "seed, solver parameters or quantization differ)"
            )
        check_payload(payload, problem, params)  # content hashes, shapes, dtypes, history vs bcd_done
        state = restore_state(payload, device)
        sampler = make_sampler(problem, params)
        sampler.load_state_dict(payload["sampler"])
        history = unpack_history(payload["history"])
    check_run_size(problem, params)
    checkpointer = lock = None
    if checkpoint_dir is not None:
        adopt = ()
        if resume_from is not None:  # the resumed segment's own files are this run's to prune
            here = os.path.abspath(os.fspath(checkpoint_dir))
            if os.path.dirname(os.path.abspath(payload["path"])) == here:
                adopt = [f for f in checkpoint_files(here) if checkpoint_iteration(f) <= payload["bcd_done"]]
        checkpointer = Checkpointer(str(checkpoint_dir), every=options.checkpoint_every, adopt=adopt)
    exch.bind(problem.topology, dtype=dtype, device=device, fuse=params.fuse)
    if resume_from is not None and hasattr(exch, "load_cost_state"):
        if "exchange_costs" not in payload and getattr(exch, "cost_state", dict)():
            warnings.warn(
                f"resume_from: checkpoint {payload['path']!r} predates the exchange's cost counters: the costs "
                "of the resumed run count its own segment only", UserWarning, stacklevel=caller_stacklevel(),
            )
        exch.load_cost_state(payload.get("exchange_costs", {}))  # cumulative over both segments

    first = {}  # X after the first BCD iteration, sketched, for the degenerate-result check

    def cb(info):
        if info.iteration == 1:
            first["X"] = x_sketch(info.state.X[:, :problem.n_agents])
        # crypto costs for loggers: info.costs (cumulative) comes from run_bcd; here the
        # records of the ADMM iterations since the last call
        info.iteration_costs = exch.pop_iteration_costs()
        if callback is None:
            return False
        if single:
            info.metrics = {k: float(v[0]) for k, v in info.metrics.items()}
        return callback(info)

    try:
        if checkpointer is not None:
            lock = lock_checkpoint_dir(checkpoint_dir, payload["path"] if resume_from is not None else None)
        try:
            state, history, info = run_bcd(problem, params, exch, callback=cb, state=state,
                                           sampler=sampler, history=history, checkpointer=checkpointer,
                                           fingerprint=fp)
        except Exception as exc:
            if params.fuse and _no_compiler(exc):
                raise ConfigError(
                    "fuse=True: TorchInductor found no working C++ compiler to compile the solver's iterations "
                    f"({_first_line(exc)}); install one (g++ or clang++, or point the CXX environment variable "
                    "at it) or run with fuse=False"
                ) from exc
            raise
        costs = exch.costs()
        per_edge = exch.bytes_per_edge()
        if per_edge:
            costs = dict(costs, bytes_per_edge=per_edge)
        if getattr(exch, "transcript", None) is not None:
            costs = dict(costs, transcript=exch.transcript)
    finally:
        exch.close()
        if lock is not None:
            lock.release()
    _warn_if_degenerate(problem, state, history, first.get("X"), info["n_iter"], params)
    return state, history, info, costs


def lock_checkpoint_dir(checkpoint_dir, continued=None) -> FolderLock:
    """Hold ``checkpoint_dir`` for this run (as the CLI holds its run folders,
    :mod:`~ppdnmf_torch.folderlock`), and refuse it when it holds checkpoints of another run:
    this run would overwrite and prune them, and resuming that run would pick up this one's.
    ``continued``: the checkpoint a resumed run continues (its folder's files are its own)."""
    here = os.path.abspath(os.fspath(checkpoint_dir))
    lock = FolderLock(here, key="checkpoint_dir", error=CheckpointError).acquire()
    files = checkpoint_files(here)
    if files and (continued is None or os.path.dirname(os.path.abspath(continued)) != here):
        lock.release()
        raise CheckpointError(
            f"checkpoint_dir: {here} holds the checkpoints of another run (newest: {os.path.basename(files[-1])}); "
            f"continue that run with resume_from={here!r}, remove its {PREFIX}*.pt files to start over there, "
            "or give this run another checkpoint_dir"
        )
    return lock


def _warn_if_degenerate(problem, state, history, sketch_first, n_iter, params) -> None:
    """A :class:`~ppdnmf_torch.errors.DegenerateResultWarning` naming what collapsed, in which
    trials, the likely cause and what to try (:mod:`~ppdnmf_torch.diagnostics`)."""
    if not history.get("nmse"):
        return
    n = problem.n_agents
    X, nmse = state.X[:, :n], history["nmse"][-1]
    found = {}
    for t in range(X.shape[0]):
        why = degenerate_reasons(X[t], float(nmse[t]), None if sketch_first is None else sketch_first[:, t], n_iter)
        if why:
            found[t] = why
    if not found:
        return
    t0 = next(iter(found))
    where = "" if X.shape[0] == 1 else f"trials {sorted(found)}: " + ("" if len(found) == 1 else f"(trial {t0}) ")
    zmax = float(problem.Z.abs().amax())
    warnings.warn(f"degenerate result: {where}{'; '.join(found[t0])}; {likely_cause(zmax, params.mu, params.eta)}",
                  DegenerateResultWarning, stacklevel=caller_stacklevel())


def _no_compiler(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is TorchInductor's missing C++ compiler."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ == "InvalidCxxCompiler" or "InvalidCxxCompiler" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
