"""One PPDNMF run behind :func:`~.api.fit` and :func:`~.api.fit_trials` (and, for what a rank
shares with them, :func:`~.distributed.fit_rank`): the solver's parameters and the exchange
made from the spec (:func:`prepare`), the privacy warnings and the codec's range checked before
any work (the driver's :func:`~ppdnmf_torch.driver.warn_degree_one`, :func:`warn_sum_leak`,
:func:`preflight`), and the run itself (:func:`run`; its checkpoints, resume and the folder's lock
are the driver's, :class:`~ppdnmf_torch.driver.Checkpoints`), which warns when the result means
nothing.
"""
from __future__ import annotations

import os
import warnings

import torch

from ..._utils import caller_stacklevel
from ...diagnostics import degenerate_reasons, likely_cause, x_sketch
from ...driver import Checkpoints, check_checkpoint_args, warn_degree_one
from ...driver import warn_sum_leak as warn_sum_leak_of
from ...errors import ConfigError, DegenerateResultWarning
from ...exchange import exchange_spec, make_exchange
from ...exchange.base import Exchange
from ...penalties import cap_bounds
from .config import OPTION_DEFAULTS, FitOptions, SolverConfig
from .problem import check_rank
from .solver import SolverParams, run_bcd

__all__ = ["prepare", "start_seed", "warn_degree_one", "warn_sum_leak", "preflight", "run"]


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
    exchange = options.exchange
    if params.x_solver != "admm" and _default_exchange(options):
        exchange = "plain"  # the default secure sum is the ADMM X-step's: a token method sends no sums
    spec = exchange_spec(exchange, protocol=options.protocol, n_max=options.n_max,
                         key_bits=options.key_bits, g_bits=options.g_bits, options=options.exchange_options)
    described = spec.spec if isinstance(spec, Exchange) else spec
    if params.x_solver != "admm" and getattr(described, "kind", None) != "plain":
        kind = getattr(described, "kind", None) or type(spec).__name__
        if isinstance(spec, Exchange):
            spec.close()  # fit owns the exchange
        raise ConfigError(f"exchange: {{x_solver}}={params.x_solver!r} passes a token and sends no secure sums, "
                          f"so the exchange {kind!r} would go unused; use exchange='plain'")
    return params, (spec if isinstance(spec, Exchange) else make_exchange(spec))


def _default_exchange(options: FitOptions) -> bool:
    """Whether ``options`` name no exchange (the spec's default kind, no setting of it given)."""
    return (isinstance(options.exchange, str) and options.exchange == OPTION_DEFAULTS.exchange
            and all(getattr(options, k) is None for k in ("protocol", "n_max", "key_bits", "g_bits", "exchange_options")))


def start_seed(init_seed, seed: int) -> int:
    """The seed of the seeded start: ``init_seed``, or the run's ``seed`` when None."""
    return int(seed if init_seed is None else init_seed)


def warn_sum_leak(exch, params, caps, degrees) -> None:
    """:class:`~ppdnmf_torch.errors.SumLeakWarning` (the driver's, once, at the user's line) when an
    integer (secure) exchange runs the ADMM X-step under a schedule whose weights differ across a
    receiver's neighbours: ``adaptive``, or ``paper`` with unequal caps in a trial (the incremental
    X-step sends no neighbour sums). ``caps (T, N)``, ``degrees``: one LongTensor ``(N,)`` per trial."""
    if params.x_solver == "admm":
        warn_sum_leak_of(exch, params.penalty_schedule, caps, degrees)


#: the largest entry of the agreed start ``X_0 = U_0`` per ``init`` (all ones; uniform on [0, 2)): public
START_BOUND = {"ones": 1.0, "random": 2.0}


def preflight(exch, blocks, caps, degree, params=None):
    """Key size vs ``n_max``: refuse a run the codec cannot hold, before any work starts.

    With ``penalty_schedule="adaptive"`` or ``"agreed"`` the caps can grow during the run: the bound
    checked is the largest they can reach (:func:`~ppdnmf_torch.penalties.cap_bounds`). The values
    exchanged are the copies ``U_i`` of ``X``, whose scale is the agreed start's
    (:data:`START_BOUND`, public), not the data's: the Y-step takes the data's scale (data scaled by
    1e-3 or 1e3 leave ``max |U|`` near the start's), so one ``n_max`` fits data of any scale and the
    bound reveals nothing about them. An iterate that outgrows the codec's headroom still raises at
    that iteration (:class:`~ppdnmf_torch.exchange.CodecRangeError`). ``blocks`` is unused.
    """
    codec = getattr(exch, "codec", None)
    if codec is None:
        return
    start = START_BOUND.get(getattr(params, "init", None), max(START_BOUND.values()))
    caps = torch.as_tensor(caps, dtype=torch.float64)
    linked = caps[torch.as_tensor(degree) > 0]
    highest = caps if params is None else cap_bounds(caps, params.penalty_schedule)
    codec.preflight(value_scale=start, g_max=float(highest.max()),
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
    check_checkpoint_args(checkpoint_dir, options.checkpoint_every, resume_key="resume_from")
    plan = None
    if checkpoint_dir is not None or resume_from is not None:  # the engine's checkpoints (ppdnmf_torch.driver)
        here = None if checkpoint_dir is None else os.path.abspath(os.fspath(checkpoint_dir))
        plan = Checkpoints(checkpoint_dir, every=options.checkpoint_every,
                           resume=False if resume_from is None else resume_from, resume_key="resume_from",
                           hint=f"resume_from={here!r}")
    exch.bind(problem.topology, dtype=dtype, device=device, fuse=params.fuse)

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
        try:
            state, history, info = run_bcd(problem, params, exch, callback=cb, checkpoints=plan)
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
    _warn_if_degenerate(problem, state, history, first.get("X"), info["n_iter"], params)
    return state, history, info, costs


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
