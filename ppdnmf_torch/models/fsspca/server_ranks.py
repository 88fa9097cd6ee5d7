"""FSSPCA with a server over ``torch.distributed`` ranks: :func:`fit_server_rank`, rank 0 the server,
the other ranks the workers, each holding its own workers' rows only (docs/FSSPCA.md, "Over ranks
and as sites").

The server's sums go through the engine's halo exchange on a star: agent 0 is the server (value
0), agents ``1..K`` the workers, every edge the same fixed penalty ``g``; the server's neighbour
sum is then ``S_0 = g^2 sum_i x_i``, the workers' sum and nothing else. Under ``exchange="secagg"``
(the default) the workers' values reach the server's rank as pairwise-masked integers only
(:class:`~ppdnmf_torch.distributed.SecAggHalo`: the workers' pair seeds are agreed through the
server's rank, which relays public keys only); under ``plain`` they cross in the clear. One
ADMM iteration of Algorithm 1: the workers' local steps (14) on their ranks, their uploads summed
at the server (one round), the server's z-step (12)-(13), ``z`` broadcast to the workers (it is
the algorithm's public output), the workers' dual steps. The centring's ``[s_i, n_i]`` and
``rho="auto"``'s / ``alpha_scale="gram"``'s ``lambda_max(C_i)`` are summed at the server the same
way (one round each); the stopping test's sum ``sum_i ||w_i - z||^2`` is one number per rank
summed across the ranks through :func:`~ppdnmf_torch.distributed.masked_sum.rank_sums` (under
``secagg`` pairwise masked: only the total is revealed; else a plain all-reduce), and the largest
``||w_i - z||`` (the history's ``consensus``) a MAX all-reduce of one number per rank, in the clear.
Every rank compares the run's public description first
(:func:`~ppdnmf_torch.distributed.site.agree_description`: the settings, ``n_features``, the
number of workers, their ranks, the exchange, the seed; never the data or a hash of it).

Checkpoints are per rank, ``<checkpoint_dir>/rank<r>/`` (the engine's
:class:`~ppdnmf_torch.driver.Checkpoints` through ``drive``: the rank's slots' ``w``, ``u``, its
copy of ``z`` and the step sizes, the counters; no key or mask seed), ``partition.json`` beside
them; a resumed run agrees new seeds and continues with the uninterrupted run's ``z``.

The sums round differently from one process's (the server divides its neighbour sum by ``g^2``;
the integer kinds quantize with the exchange's codec), so ``z`` agrees with
:func:`~.fit.fit_fsspca` (``aggregation="plain"``) to rounding under ``plain`` and to the codec's
resolution under ``quantized``/``secagg`` (tested), not bit for bit. One trial;
``rho="worker"`` and ``init="pca"`` are not offered; the history holds ``consensus``,
``primal_residual``, ``dual_residual`` and ``sparsity``.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..._utils import resolve_dtype
from ...distributed.comm import Comm
from ...distributed.halo import HaloExchange
from ...checkpoint import digest
from ...distributed.layout import RankLayout, block_period
from ...distributed.masked_sum import rank_sums
from ...distributed.partition import partition_agents
from ...distributed.site import agree_description
from ...driver import Checkpoints, LoopModel, RankCoordinator, Resources, check_checkpoint_args, drive
from ...errors import ConfigError, DataError
from ...graph import star
from . import admm
from .centring import centred_gram
from .fit import as_blocks, fit_fsspca, initial_z, per_trial
from .serverless import HeldWorkers
from .serverless_ranks import rank_exchange_spec
from .smoothing import get_smoothing

__all__ = ["fit_server_rank", "ServerRankResult", "SERVER_SETTINGS", "server_description"]

#: the settings :func:`fit_server_rank` takes, with their defaults (fit_fsspca's)
SERVER_SETTINGS = ("alpha", "lambda_2", "smoothing", "mu", "rho", "rho_scale", "line_search", "inner_steps",
                   "local_solver", "center", "alpha_scale", "max_iter", "tol", "seed", "init")


@dataclass
class ServerRankResult:
    """What :func:`fit_server_rank` returns on every rank.

    Attributes
    ----------
    z : Tensor (d, r)
        The server's ``z`` (every rank holds it).
    own : dict
        ``workers`` (global ids) and their ``w``, ``u`` ``(n_own, d, r)`` (none on the server).
    history : dict
        ``(n_iter,)`` tensors, the same on every rank.
    n_iter : int
    converged : bool
    settings : dict
    """

    z: torch.Tensor
    own: dict
    history: dict
    n_iter: int
    converged: bool
    settings: dict = field(default_factory=dict)


class StarSum:
    """The workers' sum at the server through the halo exchange on the star (see the module)."""

    def __init__(self, comm: Comm, exch, lay: RankLayout, g: float, dtype, device):
        self.comm, self.exch, self.lay = comm, exch, lay
        self.g = torch.full((int(lay.edge_ids.numel()),), float(g), dtype=torch.float64, device=device)
        self.w = float(g) ** 2
        own = lay.agents.tolist()
        self.server_slot = int(lay.slots[own.index(0)]) if 0 in own else None
        self.calls = 0

    def __call__(self, x: torch.Tensor, what: str) -> torch.Tensor:
        """``x (S, ...)`` of the rank's slots -> the sum over every worker, on every rank (the
        server broadcasts it: what it learns and publishes, ``z``'s inputs)."""
        self.calls += 1
        flat = x.reshape(x.shape[0], -1).clone()
        if self.server_slot is not None:
            flat[self.server_slot] = 0.0
        self.exch.penalty_sums(self.g, bcd_iter=self.calls, admm_iter=1)
        S = self.exch.exchange(flat, self.g, bcd_iter=self.calls, admm_iter=1).S
        total = (S[self.server_slot] / self.w if self.server_slot is not None
                 else torch.zeros_like(flat[0]))
        return self.comm.broadcast(total, 0, category="output", what=what).to(x.device).view(x.shape[1:])


class ServerRankRun(LoopModel):
    """One rank's hooks of :func:`fit_server_rank` (see the module)."""

    name = "fsspca_server_ranks"
    step_name = "ADMM iteration"

    def __init__(self, problem, z0, star_sum: StarSum, comm: Comm, own_slots, o: dict, sums, settings: dict):
        T, S, d, _ = problem.gram.shape
        self.problem, self.sum, self.comm, self.o = problem, star_sum, comm, o
        self.own_slots, self.sums, self._settings = own_slots, sums, settings
        scale = 2.0 * torch.linalg.matrix_norm(problem.gram) + o["rho"][:, None] + o["lam2"][:, None] / o["mu"]
        self.st = admm.ADMMState(w=z0[:, None].expand(T, S, d, z0.shape[-1]).clone(),
                                 u=z0.new_zeros((T, S, d, z0.shape[-1])), z=z0.clone(), theta=1.0 / scale)
        self.n_iter, self.conv = 0, False

    def step(self, k: int, clock) -> dict:
        o, st, K = self.o, self.st, self.o["n_workers"]
        r = st.z.shape[-1]
        w = admm.local_step(self.problem, st, o["lam2"], o["rho"], o["psi"], o["mu"], line_search=o["line_search"],
                            inner_steps=o["inner_steps"], solver=o["local_solver"])
        total = self.sum(admm.upload(w, st.u, o["rho"])[0], f"the server's z inputs of ADMM iteration {k}")
        z_new = admm.z_step(total[None], K, o["lam1"], o["rho"])
        u_new = admm.dual_step(st.u, w, z_new, o["rho"])
        gap = torch.linalg.matrix_norm(w - z_new[:, None])[0, self.own_slots]
        sums = self.sums.all_reduce(gap.square().sum().reshape(1), category="metrics",
                                    what=f"the primal residual of ADMM iteration {k}")
        worst = self.comm.all_reduce(gap.amax().reshape(1) if gap.numel() else gap.new_zeros(1), category="metrics",
                                     op=dist.ReduceOp.MAX, what=f"the consensus of ADMM iteration {k}")
        primal = sums.to(gap.device).sqrt()
        change = torch.linalg.matrix_norm(z_new - st.z)
        row = {"consensus": worst.to(gap.device), "primal_residual": primal,
               "dual_residual": o["rho"] * math.sqrt(K) * change,
               "sparsity": (z_new == 0).to(z_new.dtype).mean(dim=(-2, -1))}
        st.w, st.z, st.u = w, z_new, u_new
        self.n_iter += 1
        self.conv = bool((primal / math.sqrt(K * r) <= o["tol"]).all() and (change / math.sqrt(r) <= o["tol"]).all())
        return row

    def converged(self, k: int, row: dict) -> bool:
        return self.conv

    def report(self, callback, k: int, row: dict, clock) -> bool:
        return bool(callback(k, row))

    def not_converged(self, k: int, tol: float) -> str:
        return f"FSSPCA (server over ranks): did not reach tol={tol} in {k} iterations"

    # -- what a checkpoint holds (this rank's slots; see the module) ------------------------
    def state(self) -> dict:
        st = self.st
        return {"w": st.w, "u": st.u, "z": st.z, "theta": st.theta}

    def load_state(self, tensors: dict, extra: dict) -> None:
        dev, st = self.st.z.device, self.st
        st.w, st.u, st.z, st.theta = (tensors[k].to(dev) for k in ("w", "u", "z", "theta"))
        st.line_search_evals, st.line_search_failures = int(extra["evals"]), int(extra["failures"])
        self.sum.calls, self.n_iter, self.conv = int(extra["calls"]), int(extra["n_iter"]), bool(extra["converged"])

    def resumed(self, done: int, history) -> None:
        self.st.iteration = done

    def extra(self) -> dict:
        st = self.st
        return {"evals": int(st.line_search_evals), "failures": int(st.line_search_failures),
                "calls": int(self.sum.calls), "n_iter": int(self.n_iter), "converged": bool(self.conv)}

    def settings(self) -> dict:
        return self._settings

    def inputs(self) -> dict:
        # this rank's own Gram matrices (the digest stays in its own checkpoint; nothing crosses)
        return {"data": digest(self.problem.gram, self.problem.sqnorm)}


def _settings(given: dict) -> dict:
    params = inspect.signature(fit_fsspca).parameters
    unknown = sorted(set(given) - set(SERVER_SETTINGS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: not a setting of fit_server_rank (its settings: "
                          f"{', '.join(SERVER_SETTINGS)})")
    kw = {k: params[k].default for k in SERVER_SETTINGS}
    kw.update(given)
    if isinstance(kw["rho"], str) and kw["rho"] != "auto":
        raise ConfigError(f"rho: a number or 'auto' over ranks, got {kw['rho']!r}")
    if isinstance(kw["init"], str):
        raise ConfigError(f"init: None or an array over ranks, got {kw['init']!r}")
    return kw


def _problem(blocks, lay: RankLayout, star_sum: StarSum, center: bool, like):
    """The rank's workers' (centred) Gram matrices in their slots; the mean summed at the server."""
    one = HeldWorkers.of_blocks(blocks, 0) if blocks else None
    S, d = lay.n_slots, like.shape[-1]
    slots = [int(s) for s, a in zip(lay.slots.tolist(), lay.agents.tolist()) if a != 0]
    gram, sqnorm = like.new_zeros((S, d, d)), like.new_zeros((S,))
    s, n = like.new_zeros((S, d)), like.new_zeros((S,))
    if one is not None:
        idx = torch.tensor(slots, device=like.device)
        gram[idx], sqnorm[idx], s[idx], n[idx] = one.gram, one.sqnorm, one.s, one.n
    if center:
        y = torch.cat([s, n[:, None]], dim=1)
        c = star_sum.comm.all_reduce(y.abs().amax().reshape(1), category="metrics", op=dist.ReduceOp.MAX,
                                     what="the largest share (the centring's scale)").to(like.device)
        total = star_sum(y / c, "the global mean")
        gram, sqnorm = centred_gram(gram, sqnorm, s, n, total[:d] / total[d])
    return admm.FSSPCAProblem(gram[None], sqnorm[None], n[None], None), slots


def server_description(kw: dict, *, n_workers: int, owner, n_features: int, n_components: int, spec, g: float,
                       dtype) -> dict:
    """The run's public description: what every rank (site) must start with alike (compared at
    rendezvous, field by field; the settings as plain values, an ``init`` array by its digest)."""
    public = {k: (v if isinstance(v, (bool, int, float, str, type(None))) else repr(v))
              for k, v in kw.items() if k != "init"}
    init = kw["init"]
    return dict(public, init=None if init is None else digest(torch.as_tensor(init)), n_features=int(n_features),
                n_components=int(n_components), n_workers=int(n_workers), owner=list(owner), exchange=repr(spec),
                g=float(g), dtype=str(dtype))


def _options(kw: dict, problem, star_sum: StarSum, comm: Comm, K: int, like) -> dict:
    """The run's penalties (``rho="auto"``'s and ``alpha_scale="gram"``'s summed ``lambda_max``) and
    the local step's options."""
    lam = None
    if kw["alpha_scale"] != "none" or kw["rho"] == "auto":
        lam_own = torch.linalg.eigvalsh(problem.gram[0]).amax(dim=-1)[:, None]
        # over a public scale (the largest, one maximum across ranks), as the centring's, for the codec's range
        c = comm.all_reduce(lam_own.abs().amax().reshape(1), category="metrics", op=dist.ReduceOp.MAX,
                            what="the largest lambda_max (its sum's scale)").to(like.device)
        lam = (star_sum(lam_own / c, "the workers' summed lambda_max")[0] * c).reshape(1)
    lam1 = per_trial(kw["alpha"], 1, "alpha", like) * (1.0 if kw["alpha_scale"] == "none" else lam)
    lam2 = lam1 / K if kw["lambda_2"] is None else per_trial(kw["lambda_2"], 1, "lambda_2", like)
    rho = kw["rho_scale"] * lam / K if kw["rho"] == "auto" else per_trial(kw["rho"], 1, "rho", like)
    psi = get_smoothing(kw["smoothing"])
    admm.check_settings(kw["line_search"], kw["inner_steps"], kw["mu"], kw["local_solver"], psi)
    return dict(lam1=lam1, lam2=lam2, rho=rho, psi=psi, mu=kw["mu"], line_search=kw["line_search"],
                inner_steps=int(kw["inner_steps"]), local_solver=kw["local_solver"], tol=float(kw["tol"]),
                n_workers=K)


def fit_server_rank(comm: Comm, data_own, n_components: int, *, n_workers: int, n_features: int, assignment=None,
                    exchange: str = "secagg", exchange_options: dict | None = None, g: float = 1.0, callback=None,
                    checkpoint_dir=None, checkpoint_every: int = 0, resume: bool = False, dtype=None,
                    **settings) -> ServerRankResult:
    """:func:`~.fit.fit_fsspca` (one trial) with the server on rank 0 and the workers on the other
    ranks (see the module).

    Parameters
    ----------
    comm : Comm
        At least 2 ranks; rank 0 is the server.
    data_own : list of array (n_i, d) or None
        This rank's workers' rows, in increasing worker id (rank 0, the server: None).
    n_components : int
    n_workers : int
        ``K``.
    n_features : int
        ``d`` (public).
    assignment : sequence of K ints >= 1, optional
        The rank of every worker; default: consecutive workers over ranks ``1..P-1``.
    exchange, exchange_options
        ``plain``, ``quantized`` or ``secagg`` (the server's sums; see the module).
    g : float
        The fixed penalty of the star's edges (the server divides by ``g^2``).
    callback : callable, optional
        ``callback(k, row)`` after each ADMM iteration on every rank.
    checkpoint_dir, checkpoint_every, resume
        Per-rank checkpoints (see the module): ``<checkpoint_dir>/rank<r>/``; ``checkpoint_every=0``
        only at the end (and on Ctrl-C); ``resume=True`` continues from the newest iteration every
        rank has a checkpoint of.
    dtype : torch dtype or str, optional
    **settings
        :data:`SERVER_SETTINGS`, :func:`~.fit.fit_fsspca`'s defaults.
    """
    kw = _settings(settings)
    check_checkpoint_args(checkpoint_dir, checkpoint_every, resume)
    P, K = comm.world_size, int(n_workers)
    if P < 2:
        raise ConfigError(f"comm: the server is rank 0 and the workers need ranks of their own; got {P} rank(s)")
    if assignment is None:
        assignment = [1 + (i * (P - 1)) // K for i in range(K)]
    owner = [0] + [int(a) for a in assignment]
    if len(owner) != K + 1 or min(owner[1:]) < 1:
        raise ConfigError(f"assignment: {K} ranks >= 1 (rank 0 is the server), got {list(assignment)}")
    graph = star(K + 1)
    part = partition_agents(graph, P, assignment=owner)
    mine = [a - 1 for a in part.agents(comm.rank) if a != 0]
    d, r = int(n_features), int(n_components)
    if comm.rank == 0:
        blocks = []
        like = torch.zeros((1, d), dtype=torch.float64 if dtype is None else resolve_dtype(dtype), device=comm.device)
    else:
        blocks = as_blocks(list(data_own) if isinstance(data_own, (list, tuple)) else [data_own], device=comm.device,
                           dtype=dtype)
        if len(blocks) != len(mine) or any(b.shape[1] != d for b in blocks):
            raise DataError(f"this rank holds the workers {mine} of {d} features, got {len(blocks)} row blocks "
                            f"of shapes {[tuple(b.shape) for b in blocks]}", key="data")
        like = blocks[0]
    spec = rank_exchange_spec(exchange, exchange_options)
    public = server_description(kw, n_workers=K, owner=owner[1:], n_features=d, n_components=r, spec=spec, g=g,
                                dtype=like.dtype)
    agree_description(comm, public)
    lay = RankLayout.build(part, graph, comm.rank, period=block_period((d * d, d * r), like.element_size()))
    with Resources() as res:
        exch = res.own(HaloExchange(spec, lay, comm))
        exch.bind(lay.local_topology(graph), dtype=like.dtype, device=like.device)
        sums = res.own(rank_sums(comm, spec.kind))
        star_sum = StarSum(comm, exch, lay, g, like.dtype, like.device)
        problem, slots = _problem(blocks, lay, star_sum, bool(kw["center"]), like)
        del blocks, data_own
        o = _options(kw, problem, star_sum, comm, K, like)
        z0 = initial_z(d, r, 1, kw["seed"], kw["init"], like.dtype, like.device)
        run = ServerRankRun(problem, z0, star_sum, comm, torch.tensor(slots, dtype=torch.long, device=like.device), o,
                            sums, {k: v for k, v in public.items() if k != "max_iter"})
        plan = None if checkpoint_dir is None else Checkpoints(checkpoint_dir, every=checkpoint_every, resume=resume,
                                                                 device=like.device)
        out = drive(run, max_iter=int(kw["max_iter"]), tol=o["tol"], callback=callback, checkpoints=plan,
                    ranks=RankCoordinator(comm, part.summary()))
    idx = torch.tensor(slots, dtype=torch.long, device=like.device)
    own = {"workers": mine, "w": run.st.w[0, idx].clone(), "u": run.st.u[0, idx].clone()}
    history = {k: torch.stack(v)[:, 0] for k, v in out.history.items()}
    settings_out = dict(n_workers=K, exchange=spec.kind, g=float(g), alpha=o["lam1"].tolist(),
                        lambda_2=o["lam2"].tolist(), rho=o["rho"].tolist(), world_size=P)
    return ServerRankResult(run.st.z[0], own, history, run.n_iter, run.conv, settings_out)
