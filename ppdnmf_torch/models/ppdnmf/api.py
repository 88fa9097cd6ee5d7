"""The public entry point :func:`fit` and its result object."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import torch

from ..._utils import ConfigError, caller_stacklevel, resolve_device, resolve_dtype
from ...errors import DegreeOneWarning, SumLeakWarning
from ...exchange import exchange_spec, make_exchange
from ...exchange.base import Exchange
from ...exchange.base import accepts_keyword
from ...graph import Graph, check_min_degree, complete
from .memory import check_fit
from .problem import (as_blocks, as_caps, as_graph, as_seed, build_problem, check_data, check_iteration_buffers,
                      check_rank, finite_positive)
from ...checkpoint import PREFIX, CheckpointError, Checkpointer, check_payload, checkpoint_files, checkpoint_iteration, \
    fingerprint, load_checkpoint, unpack_history
from ...diagnostics import degenerate_reasons, likely_cause, x_sketch
from ...errors import DegenerateResultWarning
from ...penalties import cap_bounds, check_shared_caps, sum_leak_message
from ...folderlock import FolderLock
from .solver import SolverParams, make_sampler, restore_state, run_bcd
from .solver.state import DEFAULTS, PAPER_SETTINGS, STOPPING
from ...threads import with_threads

__all__ = ["FitResult", "TrialsResult", "fit", "fit_trials", "fit_centralized", "check_min_degree", "DEFAULTS",
           "PAPER_SETTINGS"]


@dataclass
class FitResult:
    """Result of :func:`fit`.

    Attributes
    ----------
    X : Tensor (N, L, K)
        Every agent's left factor ``X_i`` (nonnegative).
    Y : list of N Tensors (K, M_i)
        Every agent's right factor block.
    U : Tensor (N, L, K)
        The ADMM copies ``U_i`` of the last X-step.
    history : dict of lists
        One entry per BCD iteration: ``nmse``, ``consensus``, ``nmse_worst`` (the NMSE of
        the whole data under the left factor of the agent farthest from the mean, right
        factors refit: it cannot hide disagreement, :mod:`ppdnmf_torch.models.ppdnmf.solver.refit`),
        ``objective``, ``x_primal``, ``x_dual``, ``y_primal``, ``y_dual`` (for
        ``y_solver="hals"``: 0 and the last sweep's change), ``time_x``, ``time_y`` (floats) and
        ``x_iters``, ``y_iters`` (per-agent ADMM iteration counts); for an exchange that
        counts costs, also ``crypto_<counter>`` (the cumulative values of :attr:`costs`'
        numbers after each BCD iteration; a resumed run continues them).
    graph : Graph
    columns : list of int
        ``M_i`` per agent.
    n_iter : int
        BCD iterations run.
    converged : bool
        Whether the stopping rule stopped every agent (always False with ``tol=0``).
    costs : dict
        The exchange's cost counters (empty for ``plain``): flat numbers, plus
        ``bytes_per_edge`` ({"i->j": bytes}) and, when recorded, ``transcript``.
    """

    X: torch.Tensor
    Y: list
    U: torch.Tensor
    history: dict
    graph: Graph
    columns: list
    n_iter: int
    converged: bool
    costs: dict = field(default_factory=dict)

    @property
    def X_mean(self) -> torch.Tensor:
        """The agents' average left factor ``(L, K)``."""
        return self.X.mean(dim=0)

    def reconstruction(self, i: int | None = None) -> torch.Tensor:
        """``X_i Y_i (L, M_i)`` of agent ``i``, or all blocks side by side ``(L, M)`` when ``i`` is None."""
        if i is not None:
            return self.X[i] @ self.Y[i]
        return torch.cat([self.X[k] @ self.Y[k] for k in range(len(self.Y))], dim=1)

    @property
    def nmse(self) -> float:
        return self.history["nmse"][-1]

    @property
    def consensus(self) -> float | None:
        """The last consensus error; None when the run did not measure it (a distributed run
        with ``share="sums"``, whose ranks keep their ``X_i``)."""
        h = self.history.get("consensus")
        return h[-1] if h else None


def _history_single(history: dict) -> dict:
    """Batched history (tensors over trials) -> plain lists for a single trial."""
    out = {}
    for k, vals in history.items():
        if vals and isinstance(vals[0], torch.Tensor):
            if vals[0].dim() == 1:
                out[k] = [float(v[0]) for v in vals]
            else:
                out[k] = [v[0].tolist() for v in vals]
        else:
            out[k] = list(vals)
    return out


#: the incremental X-step's keywords of fit / fit_trials and their defaults (SolverParams' fields)
X_SOLVER_KEYS = ("x_solver", "x_rho", "x_gamma_spread", "x_sigma", "x_rounds", "x_start", "x_walk")


def _prepare(rank, L, *, n_max, mu, eta, bcd_iters, x_iters, y_iters, tol, admm_tol, penalty,
             consensus_form, exchange, protocol, key_bits, g_bits, exchange_options, fuse=False,
             penalty_schedule="paper", init="ones", y_solver="admm", x_solver=None):
    """The solver's parameters and the run's exchange (made from its spec here; a given
    :class:`~ppdnmf_torch.exchange.Exchange` is used as it is, its settings checked against
    the flat keywords: nothing is dropped). ``x_solver``: the incremental X-step's keywords."""
    check_rank(rank, L)
    for name, value in (("mu", mu), ("eta", eta)):
        finite_positive(name, value)  # refuses True and False too: they are not penalties
    for name, value in (("tol", tol), ("admm_tol", admm_tol)):
        if value is not None:
            finite_positive(name, value, inclusive=True)
    params = SolverParams(rank=rank, mu=mu, eta=eta, bcd_iters=bcd_iters, x_iters=x_iters,
                          y_iters=y_iters, tol=tol, admm_tol=admm_tol, penalty=penalty,
                          consensus_form=consensus_form, fuse=bool(fuse), penalty_schedule=penalty_schedule,
                          init=init, y_solver=y_solver, **(x_solver or {}))
    spec = exchange_spec(exchange, protocol=protocol, n_max=n_max, key_bits=key_bits, g_bits=g_bits,
                         options=exchange_options)
    described = spec.spec if isinstance(spec, Exchange) else spec
    if params.x_solver != "admm" and getattr(described, "kind", None) != "plain":
        kind = getattr(described, "kind", None) or type(spec).__name__
        if isinstance(spec, Exchange):
            spec.close()  # fit owns the exchange
        raise ConfigError(f"exchange: {{x_solver}}={params.x_solver!r} passes a token and sends no secure sums, "
                          f"so the exchange {kind!r} would go unused; use exchange='plain'")
    return params, (spec if isinstance(spec, Exchange) else make_exchange(spec))


def _init_seed(init_seed, seed) -> int:
    """The seed of the seeded start: ``init_seed``, or the run's ``seed`` when None."""
    value = seed if init_seed is None else init_seed
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"init_seed: must be None or an integer, got {init_seed!r}")
    return int(value)


def _warn_degree_one(exch, graphs) -> None:
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


def _preflight(exch, blocks, caps, degree, params=None):
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


def _run(problem, params, exch, callback, *, single: bool, dtype, device, checkpoint_dir=None,
         checkpoint_every=0, resume_from=None):
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
    check_iteration_buffers(problem, params.rank, params.x_iters)
    checkpointer = lock = None
    if checkpoint_dir is not None:
        adopt = ()
        if resume_from is not None:  # the resumed segment's own files are this run's to prune
            here = os.path.abspath(os.fspath(checkpoint_dir))
            if os.path.dirname(os.path.abspath(payload["path"])) == here:
                adopt = [f for f in checkpoint_files(here) if checkpoint_iteration(f) <= payload["bcd_done"]]
        checkpointer = Checkpointer(str(checkpoint_dir), every=checkpoint_every, adopt=adopt)
    if accepts_keyword(exch.bind, "fuse"):
        exch.bind(problem.topology, dtype=dtype, device=device, fuse=params.fuse)
    else:  # an exchange written against the older interface
        exch.bind(problem.topology, dtype=dtype, device=device)
    if resume_from is not None and hasattr(exch, "load_cost_state"):
        if "exchange_costs" not in payload and getattr(exch, "cost_state", dict)():
            warnings.warn(
                f"resume_from: checkpoint {payload['path']!r} predates the exchange's cost counters: the costs "
                "of the resumed run count its own segment only", UserWarning, stacklevel=3,
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
            lock = _lock_checkpoint_dir(checkpoint_dir, payload["path"] if resume_from is not None else None)
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


def _lock_checkpoint_dir(checkpoint_dir, continued=None) -> FolderLock:
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
                  DegenerateResultWarning, stacklevel=5)  # the caller of fit (through with_threads)


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


@with_threads
def fit(Z, adjacency, rank, *, columns=None, mu=0.1, eta=1.0, g_max=0.033,
        bcd_iters=STOPPING["bcd_iters"], x_iters=30, y_iters=30, tol=STOPPING["tol"],
        admm_tol=STOPPING["admm_tol"],
        exchange="plain", protocol=None, n_max=None, key_bits=None, g_bits=None,
        penalty="random", consensus_form="derived", negative="error",
        seed=0, device="auto", dtype=torch.float64, callback=None, exchange_options=None,
        checkpoint_dir=None, checkpoint_every=1, resume_from=None, fuse=False, threads=None,
        penalty_schedule=DEFAULTS["penalty_schedule"], init=DEFAULTS["init"], init_seed=None,
        y_solver=DEFAULTS["y_solver"], x_solver="admm", x_rho=0.1, x_gamma_spread=0.05, x_sigma=1e-3,
        x_rounds=None, x_start=None, x_walk="auto", min_degree=None) -> FitResult:
    """Factorize ``Z ~ X Y`` with N agents on a graph (PPDNMF, Algorithm 1).

    Parameters
    ----------
    Z : array-like or Tensor (L, M), or list of N blocks (L, M_i)
        Nonnegative data. A single matrix is split by columns (``columns``).
    adjacency : (N, N) symmetric 0/1 array-like, torch sparse tensor, networkx graph, or Graph
        Connected, without self loops.
    rank : int
        ``K``, ``1 <= K <= L``.
    columns : list of int, optional
        Per-agent column counts summing to M; equal split when omitted.
    mu, eta : float
        ADMM penalties of the X-step (eqs. 8-11) and Y-step (eqs. 12-14).
    g_max : float or sequence of N floats
        Penalty caps ``g_i``.
    bcd_iters, x_iters, y_iters : int
        Iteration caps.
    tol : float
        Relative-change tolerance of the Sec. II-C stopping rule; ``0`` runs the fixed counts.
        The BCD loop checks both factors ``X_i`` and ``Y_i``, from the second BCD iteration
        on (after the first, with one ADMM iteration per step, both still equal their
        start); the ADMM loops check ``U_i`` and ``V_i``.
    admm_tol : float, optional
        Tolerance of the ADMM loops alone (default: ``tol``); ``0`` keeps fixed ADMM counts.
    exchange : {"plain", "quantized", "paillier"}, ExchangeSpec or Exchange
        The exchange kind, a typed spec (:class:`~ppdnmf_torch.exchange.QuantizedSpec`,
        :class:`~ppdnmf_torch.exchange.PaillierSpec`, ...) or an exchange object. ``fit``
        owns the exchange: it closes it at the end (a Paillier exchange's keys go with it).
    protocol, n_max, key_bits, g_bits : optional
        Shorthand for the integer kinds' spec fields (None: the spec's default; a value
        that does not apply to the kind, or contradicts a given spec or exchange, is a
        :class:`~ppdnmf_torch.ConfigError`). ``protocol``: ``"masked"`` (hides each
        neighbour's term from the receiver), ``"aggregated"`` or ``"paper"`` (the printed
        protocols; docs/SECURE_EXCHANGE.md), the spec's default if not given; ``n_max``:
        quantization scale (the paper's ``N_max``, default 1e6);
        ``key_bits``: Paillier key size (default 2048; smaller sizes warn); ``g_bits``:
        penalties are scaled by ``2^g_bits`` (default 16).
    penalty : {"random", "fixed"}
        Monotone random draws (Sec. III-B) or ``g_{i->j} = g_i``.
    consensus_form : {"derived", "paper_literal"}
        See ALGORITHM.md, "The consensus term in step 3".
    negative : {"error", "clip", "shift", "allow"}
        What to do with negative entries of ``Z``.
    seed : int
        Seeds the penalty draws (and the seeded start, unless ``init_seed`` is given).
    device : {"auto", "cpu", "cuda"} or torch.device
    dtype : torch.float64 or torch.float32
    callback : callable, optional
        ``callback(info)`` after each BCD iteration, ``info.metrics`` holding floats;
        return True to stop.
    exchange_options : dict, optional
        Further settings of the kind's spec (e.g. ``workers``, ``cost_model``;
        :data:`~ppdnmf_torch.exchange.EXCHANGE_OPTIONS`).
    checkpoint_dir : str or Path, optional
        Write crash-safe checkpoints there (every ``checkpoint_every`` BCD iterations, and
        on Ctrl-C, which then raises :class:`~ppdnmf_torch.models.ppdnmf.solver.RunInterrupted`).
    checkpoint_every : int
        BCD iterations between checkpoints (``0``: only on Ctrl-C).
    resume_from : str or Path, optional
        A checkpoint file, or a folder whose newest checkpoint is used. The run must be
        the same (data, graph, seed, parameters); it continues bit for bit (on CPU: CUDA's
        atomic additions may round differently from run to run).
    fuse : bool
        Compile the ADMM iterations with TorchInductor: small problems run a whole
        iteration (with the ``plain`` exchange's neighbour sum, and for ranks below 8 the
        products too) as one compiled graph called without ``torch.compile``'s per-call
        guards, large ones compile the elementwise chains (``torch.compile``) into single
        passes over reused buffers. Faster than the eager default at every size measured
        (see docs/PERFORMANCE.md), at the cost of a compilation per shape
        (seconds, once per process while the shape stays among the 8 most recently used
        of each whole-iteration graph; past torch's limit of 8 recompilations of one
        chain it runs uncompiled); rounds slightly differently (fused multiply-adds).
        Needs a C++ compiler on CPU (without one, a ``ConfigError`` says so). With an
        incremental ``x_solver``: each round of the token runs as one compiled graph.
    threads : int, optional
        CPU threads of torch's intra-op pool for this call (restored afterwards); None: the
        package's default (:func:`~ppdnmf_torch.threads.default_threads`: one thread, or
        torch's current count when ``OMP_NUM_THREADS`` is set).
    penalty_schedule : {"agreed", "adaptive", "paper"}
        ``"agreed"`` (default): every edge takes one common penalty per ADMM iteration,
        ``g^(m)`` drawn monotone in ``(g^(m-1), g]`` from a stream all agents agree on, so
        every ``rho_ij = g^(m)^2`` and a receiver's sums reveal no single neighbour; the one
        cap ``g`` (``g_max``, which must be one number) grows by 1.2x after a BCD iteration,
        to at most 32x ``g_max``, when some agent still disagrees with its neighbours (one
        bit per BCD iteration, spread like the stopping rule's flags); each agent's ``mu_i``
        rises to a quarter of ``tr(Y_i Y_i^T) / K`` when ``mu`` is smaller, and to
        ``2 d_i g^2`` when the common cap needs it (``rho_i <= mu_i / 2``), privately
        (:mod:`ppdnmf_torch.models.ppdnmf.solver.schedule`).
        ``"adaptive"``: each agent raises its own cap ``g_i`` the same way from its own
        disagreement (unequal weights: an integer exchange warns,
        :class:`~ppdnmf_torch.SumLeakWarning`). The integer exchanges' range is checked
        against the 32x bound before the run. ``"paper"``: the fixed caps of Sec. III-B.
    init : {"random", "ones"}
        The start ``X_0 = U_0``: ``"random"`` (default) draws it from ``init_seed``, the same
        on every agent (uniform on ``[0, 2)``, :func:`~ppdnmf_torch.models.ppdnmf.solver.state.initial_factor`);
        ``"ones"`` is the paper's all-ones start, a symmetric saddle that only rounding breaks.
    init_seed : int, optional
        Seed of ``init="random"``; None (default) uses ``seed``.
    y_solver : {"admm", "hals"}
        The Y-step: ``y_iters`` ADMM iterations (eqs. 12-14, default) or ``y_iters`` HALS
        sweeps (:mod:`ppdnmf_torch.models.ppdnmf.solver.hals`).
    x_solver : {"admm", "i_admm", "pi_admm", "pi_admm2"}
        The X-step: the paper's decentralized ADMM with the secure exchange (default), or the
        incremental consensus engine (docs/INCREMENTAL.md): one token walks a Hamiltonian
        cycle of the graph (I-ADMM; PI-ADMM1 with a private step size per activation;
        PI-ADMM2 with Gaussian noise on every new ``x_i``), the agents use its projection
        ``max(z, 0)`` (outside the paper's analysis), and the state carries over between BCD
        iterations. Needs ``exchange="plain"`` (nothing is exchanged but the token); ``mu``
        and the penalty settings (``g_max``, ``penalty``, ``penalty_schedule``) do not enter
        it. History keys ``x_vectors`` / ``x_bytes`` count its messages per BCD iteration.
    x_rho : float
        The incremental methods' penalty ``rho``.
    x_gamma_spread : float
        ``pi_admm``: ``gamma ~ U(1 - s / x_rho, 1 + s / x_rho)``, ``s < x_rho``.
    x_sigma : float
        ``pi_admm2``: the noise's standard deviation.
    x_rounds : int, optional
        Rounds of the token per X-step (each agent solves once per round); default
        ``x_iters``: the same local work as the ADMM X-step.
    x_start : (low, high), optional
        The private start offsets ``v_i ~ U(low, high)`` (Algorithm 2 around ``X = 1``);
        default ``(0, 0)`` for ``i_admm``, ``(-1, 1)`` for the PI-ADMMs.
    x_walk : {"auto", "cycle"}
        "cycle" requires a Hamiltonian cycle (a ``GraphError`` otherwise); "auto" falls back
        to a closed walk whose relays forward the token (each hop counts a message).

    min_degree : int, optional
        Refuse graphs with an agent of fewer neighbours (:class:`~ppdnmf_torch.GraphError`).
        ``min_degree=2`` refuses agents with a single neighbour, whose sums are that
        neighbour's term under any protocol; without it, an integer exchange (``quantized``,
        ``paillier``) warns naming them (:class:`~ppdnmf_torch.DegreeOneWarning`).

    The paper's settings are ``penalty_schedule="paper", init="ones", y_solver="admm"``
    (:data:`PAPER_SETTINGS`); ``experiment=paper_*`` and :func:`~ppdnmf_torch.run_experiment`'s
    presets use them.

    Returns
    -------
    FitResult

    Warns
    -----
    DegenerateResultWarning
        When the result is degenerate (an all-zero ``X_i``, an NMSE of 1, or ``X`` that did
        not move), with the likely cause and what to try.
    DataScaleWarning
        Up front, when the data's largest entry is far from 1.
    SumLeakWarning
        Up front, when an integer exchange runs under ``penalty_schedule="adaptive"``, or
        ``"paper"`` with unequal caps: a receiver's weights differ across its neighbours.
    """
    device = resolve_device(device)
    dtype = resolve_dtype(dtype)
    graph = as_graph(adjacency)
    check_min_degree(graph, min_degree)
    N = graph.n_agents
    blocks = check_data(as_blocks(Z, N, columns), negative)
    caps = as_caps(g_max, N)
    seed = as_seed(seed)
    params, exch = _prepare(rank, blocks[0].shape[0], n_max=n_max, mu=mu, eta=eta, bcd_iters=bcd_iters,
                            x_iters=x_iters, y_iters=y_iters, tol=tol, admm_tol=admm_tol, penalty=penalty,
                            consensus_form=consensus_form, exchange=exchange, protocol=protocol,
                            key_bits=key_bits, g_bits=g_bits, exchange_options=exchange_options, fuse=fuse,
                            penalty_schedule=penalty_schedule, init=init, y_solver=y_solver,
                            x_solver=dict(x_solver=x_solver, x_rho=x_rho, x_gamma_spread=x_gamma_spread,
                                          x_sigma=x_sigma, x_rounds=x_rounds, x_start=x_start, x_walk=x_walk))
    _warn_degree_one(exch, [graph])
    warn_sum_leak(exch, params, caps[None], [graph.degree])
    try:
        check_shared_caps(caps, params.penalty_schedule)
        _preflight(exch, blocks, caps, graph.degree, params)
        check_fit([blocks], [graph], params, dtype=dtype, device=device, exchange=exch)
        problem = build_problem([blocks], [graph], caps[None], [seed], dtype=dtype, device=device,
                                init_seeds=[_init_seed(init_seed, seed)])
    except BaseException:
        exch.close()  # fit owns the exchange, also when it fails before the run
        raise
    state, history, info, costs = _run(problem, params, exch, callback, single=True, dtype=dtype, device=device,
                                       checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                                       resume_from=resume_from)
    counts = [b.shape[1] for b in blocks]
    return FitResult(
        X=state.X[0],
        Y=[state.Y[0, i, :, :c] for i, c in enumerate(counts)],
        U=state.U[0],
        history=_history_single(history),
        graph=graph,
        columns=counts,
        n_iter=info["n_iter"],
        converged=info["converged"],
        costs=costs,
    )


@dataclass
class TrialsResult:
    """Result of :func:`fit_trials`: ``T`` independent problems solved as one batch.

    Attributes
    ----------
    X : Tensor (T, N, L, K)
    Y : Tensor (T, N, K, M_max)
        Zero-padded; agent ``i`` of trial ``t`` owns ``Y[t, i, :, :columns[t][i]]``.
    U : Tensor (T, N, L, K)
    columns : list (T) of list (N) of int
    history : dict
        Per BCD iteration, arrays of shape ``(n_iter, T)`` (``(n_iter, T, N)`` for the
        per-agent ADMM counts, ``(n_iter,)`` for the batch's step times and its
        ``crypto_<counter>`` costs).
    graphs : list of Graph
    seeds : list of int
    n_iter : int
    costs : dict
    """

    X: torch.Tensor
    Y: torch.Tensor
    U: torch.Tensor
    columns: list
    history: dict
    graphs: list
    seeds: list
    n_iter: int
    converged: bool
    costs: dict = field(default_factory=dict)

    @property
    def n_trials(self) -> int:
        return self.X.shape[0]

    def trial_Y(self, t: int) -> list:
        """Agent blocks ``Y_i (K, M_i)`` of trial ``t``."""
        return [self.Y[t, i, :, :c] for i, c in enumerate(self.columns[t])]


def _history_batched(history: dict) -> dict:
    import numpy as np  # results for users are numpy arrays; the solver stays torch

    out = {}
    for k, vals in history.items():
        if vals and isinstance(vals[0], torch.Tensor):
            out[k] = torch.stack(vals).numpy()
        else:
            out[k] = np.asarray(vals, dtype=np.float64)
    return out


@with_threads
def fit_trials(block_lists, graphs, rank, *, seeds, g_max=0.033, mu=0.1, eta=1.0,
               bcd_iters=STOPPING["bcd_iters"], x_iters=30, y_iters=30, tol=STOPPING["tol"],
               admm_tol=STOPPING["admm_tol"],
               exchange="plain", protocol=None, n_max=None, key_bits=None, g_bits=None,
               penalty="random", consensus_form="derived", negative="error",
               device="auto", dtype=torch.float64, callback=None, exchange_options=None,
               align_trials=True, fuse=False, threads=None, penalty_schedule=DEFAULTS["penalty_schedule"],
               init=DEFAULTS["init"], init_seeds=None, y_solver=DEFAULTS["y_solver"], x_solver="admm",
               x_rho=0.1, x_gamma_spread=0.05, x_sigma=1e-3, x_rounds=None, x_start=None,
               x_walk="auto", min_degree=None) -> TrialsResult:
    """Solve ``T`` independent PPDNMF problems as one batched computation.

    Trial ``t`` is exactly what :func:`fit` computes for ``block_lists[t]`` on
    ``graphs[t]`` with ``seed=seeds[t]``: the trials share no random stream, and the
    batch only stacks them along a leading trial dimension (the graphs become one
    block-diagonal sparse matrix).

    Parameters
    ----------
    block_lists : list (T) of list (N) of (L, M_i) blocks
    graphs : list (T) of Graph or adjacency, each with N agents
    rank : int
    seeds : list (T) of int
        Penalty seeds, one per trial.
    g_max : float, (N,) or (T, N) caps
    align_trials : bool
        Pad each trial with isolated dummy agents so that every trial starts on a 64-byte
        boundary, which makes trial ``t`` bit-identical to the same problem run alone on CPU
        (small BLAS/LAPACK kernels round differently at different alignments). It costs
        at most 7 dummy agents per trial (for ``N = 10``: 16 agents computed); without it,
        trials agree with single runs only to rounding, which Algorithm 1's symmetric
        start amplifies over the BCD iterations.

    Other Parameters
    ----------------
    mu, eta, bcd_iters, x_iters, y_iters, tol, admm_tol, exchange, protocol, n_max, key_bits
        As in :func:`fit`.
    g_bits, penalty, consensus_form, negative, device, dtype, exchange_options, fuse, threads,
    min_degree
        As in :func:`fit`.
    x_solver, x_rho, x_gamma_spread, x_sigma, x_rounds, x_start, x_walk
        As in :func:`fit` (each trial walks its own graph's cycle). There is no ``columns``
        (each trial's blocks are given) and no checkpointing.
    penalty_schedule, init, y_solver
        As in :func:`fit`.
    init_seeds : list (T) of int, optional
        Seeds of ``init="random"``, one per trial; None (default) uses ``seeds``.
    callback : callable, optional
        As in :func:`fit`, with ``info.metrics`` as Tensors ``(T,)``.

    Returns
    -------
    TrialsResult
    """
    device = resolve_device(device)
    dtype = resolve_dtype(dtype)
    T = len(block_lists)
    if T < 1 or len(graphs) != T or len(seeds) != T:
        raise ConfigError(
            f"trials: got {T} data sets, {len(graphs)} graphs and {len(seeds)} seeds; need the same number >= 1"
        )
    graphs = [as_graph(g) for g in graphs]
    seeds = [as_seed(s, f"seeds[{t}]") for t, s in enumerate(seeds)]
    for t, g in enumerate(graphs):
        check_min_degree(g, min_degree, trial=t)
    N = graphs[0].n_agents
    blocks = [check_data(as_blocks(b, N), negative) for b in block_lists]
    caps_t = torch.as_tensor(g_max, dtype=torch.float64)
    if caps_t.dim() == 2:
        if tuple(caps_t.shape) != (T, N):
            raise ConfigError(f"g_max: a 2-D cap array must have shape ({T}, {N}), got {tuple(caps_t.shape)}")
        caps = torch.stack([as_caps(row.tolist(), N) for row in caps_t])
    else:
        caps = as_caps(g_max if caps_t.dim() == 0 else caps_t.tolist(), N).expand(T, N)
    params, exch = _prepare(rank, blocks[0][0].shape[0], n_max=n_max, mu=mu, eta=eta, bcd_iters=bcd_iters,
                            x_iters=x_iters, y_iters=y_iters, tol=tol, admm_tol=admm_tol, penalty=penalty,
                            consensus_form=consensus_form, exchange=exchange, protocol=protocol,
                            key_bits=key_bits, g_bits=g_bits, exchange_options=exchange_options, fuse=fuse,
                            penalty_schedule=penalty_schedule, init=init, y_solver=y_solver,
                            x_solver=dict(x_solver=x_solver, x_rho=x_rho, x_gamma_spread=x_gamma_spread,
                                          x_sigma=x_sigma, x_rounds=x_rounds, x_start=x_start, x_walk=x_walk))
    _warn_degree_one(exch, graphs)
    warn_sum_leak(exch, params, caps, [g.degree for g in graphs])
    try:
        check_shared_caps(caps, params.penalty_schedule)
        for b, g, c in zip(blocks, graphs, caps):
            _preflight(exch, b, c, g.degree, params)
        if init_seeds is not None and len(init_seeds) != T:
            raise ConfigError(f"init_seeds: got {len(init_seeds)} seeds for {T} trials; give one per trial (or None)")
        check_fit(blocks, graphs, params, dtype=dtype, device=device, exchange=exch)
        problem = build_problem(blocks, graphs, caps, seeds, dtype=dtype, device=device,
                                rank=rank if align_trials else None,
                                init_seeds=[_init_seed(None if init_seeds is None else init_seeds[t], seeds[t])
                                            for t in range(T)])
    except BaseException:
        exch.close()  # fit_trials owns the exchange, also when it fails before the run
        raise
    state, history, info, costs = _run(problem, params, exch, callback, single=False, dtype=dtype, device=device)
    N = problem.n_agents
    return TrialsResult(
        X=state.X[:, :N], Y=state.Y[:, :N], U=state.U[:, :N],
        columns=problem.counts[:, :N].cpu().tolist(),
        history=_history_batched(history),
        graphs=graphs, seeds=[int(s) for s in seeds],
        n_iter=info["n_iter"], converged=info["converged"], costs=costs,
    )


def fit_centralized(Z, rank, **kwargs) -> FitResult:
    """The centralized baseline: the same BCD/ADMM on the whole ``Z`` with one agent.

    Takes the keyword arguments of :func:`fit` (``columns`` and the exchange
    settings do not apply: one agent has no neighbours).
    """
    for k in ("columns", "exchange", "protocol", "n_max", "key_bits", "g_bits", "exchange_options"):
        if k in kwargs:
            raise ConfigError(f"{k}: does not apply to the centralized baseline (one agent, no exchange)")
    if isinstance(Z, (list, tuple)):
        Z = torch.cat([torch.as_tensor(b, dtype=torch.float64) for b in Z], dim=1)
    return fit(Z, complete(1), rank, **kwargs)
