"""Privacy audit of the incremental X-step (``x_solver`` = "i_admm", "pi_admm", "pi_admm2"):
what the tokens tell an eavesdropper on every link and a curious agent on the walk.

The wire carries one plaintext token ``z`` (an ``L x K`` matrix) per hop; the adversaries
know ``rho``, ``N``, the visiting order, the projection ``P(z) = max(z, 0)`` and the
public start ``X^0 = 1`` (the solver's), so ``u_i^0 = x_i^0 - y_i^0 / rho = X^0`` for every
agent (Algorithm 2 around ``X^0``; docs/INCREMENTAL.md). Recorded by :func:`record_incremental_fit`
through an exchange with the :class:`TokenRecorder` mixin (the X-step hands every transcript
to it), over all X-steps of a run: the recursions need no ``f_i``, so they run across the
BCD iterations as one walk.

**(a) Eavesdropper on every link** (:func:`eavesdropper_incremental`):

* ``offsets``: each token increment is ``(u_new - u_old) / N`` with ``u_i = x_i - y_i / rho``
  (eq. 5), so :func:`~ppdnmf_torch.consensus.eavesdrop_offsets` recovers every ``u_i^k``
  exactly, whatever the step sizes and noises;
* ``recursion``: recursion (11) with the projection, from the public start ``x = X^0``,
  ``y = 0``: exact against I-ADMM, wrong against the private start and step sizes;
* ``consensus``: ``x_i ~ P(z)`` (the legitimate output), then ``y_i ~ rho (P(z) - u_i)``
  (offsets + consensus), at the end of the run; the multiplier is the agent's gradient
  (``grad f_i(x_i) = y_i`` after its exact step), so the same error holds for it;
* ``lsqr``: the least-squares attack on the sparse system (Sec. V, with the projection and
  ``u_i^0 = X^0``) on one coordinate of one agent, to convergence and with MATLAB's lsqr
  defaults.

**(b) A curious agent** ``i`` on the walk (:func:`curious_agent_incremental`) sees the
token when it receives it, when it sends it and, on a relaying walk, when it relays it;
it knows its own ``u_i``. Between two of its observations the token moved by
``(1/N) sum_j (u_j^new - u_j^old)`` over the agents that updated in between: with one of
them, ``i`` learns that agent's ``u_j`` exactly; with several (on a Hamiltonian cycle:
the ``N - 1`` others) only their sum, which it splits equally. Its estimate of its
predecessor ``p``'s state at its last observation: ``x_p ~ P(z)``, ``u_p`` as above,
``y_p = grad f_p(x_p) ~ rho (P(z) - u_p)``; the baseline is ``y_p ~ 0`` (relative error 1).

Relative errors are Frobenius norms per agent, ``||est - true|| / ||true||``; "exact"
means below :data:`EXACT_REL`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..api import fit
from ....consensus import eavesdrop_offsets, eavesdrop_recursion, lsqr_attack, project_nonnegative
from ....errors import ConfigError
from ....exchange import PlainSpec, make_exchange
from ..solver.incremental import relay_routes

__all__ = ["TokenRecorder", "TokenRecording", "record_incremental_fit", "eavesdropper_incremental",
           "curious_agent_incremental", "incremental_audit", "EXACT_REL", "MATLAB_LSQR"]

#: a relative error below this counts as an exact recovery
EXACT_REL = 1e-9
#: MATLAB's lsqr defaults (Sec. V's attack as the paper would have run it)
MATLAB_LSQR = dict(atol=1e-6, btol=1e-6, iter_lim=20)


class TokenRecorder:
    """Mixin for the ``plain`` exchange (:func:`~ppdnmf_torch.exchange.make_exchange`'s ``mixin``):
    the incremental X-step calls :meth:`record_tokens` with each X-step's transcript."""

    def bind(self, topology, **kw):
        super().bind(topology, **kw)
        self.__dict__.setdefault("token_records", [])

    def record_tokens(self, *, bcd_iter, rho, tokens, agents, order, x, y):
        self.__dict__.setdefault("token_records", []).append(
            {"bcd": bcd_iter, "rho": rho, "tokens": tokens, "agents": agents, "order": order, "x": x, "y": y})


@dataclass
class TokenRecording:
    """One trial's walk over a whole run.

    Attributes
    ----------
    tokens : Tensor (S + 1, L, K)
        ``z^0 .. z^S`` over every X-step (``z^k``: what step ``k``'s agent receives).
    agents : LongTensor (S,)
    x, y : Tensor (S + 1, n, L, K)
        Every agent's state after ``0 .. S`` steps (ground truth).
    order : tuple of int
        The visiting order.
    routes : list of list of int
        The relays between ``order[k]`` and the next agent (empty on a Hamiltonian cycle).
    rho : float
    u0 : Tensor (n, L, K)
        The public ``u_i^0 = X^0``.
    x_solver : str
    nmse, consensus : float
        Of the recorded run.
    """

    tokens: torch.Tensor
    agents: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    order: tuple
    routes: list
    rho: float
    u0: torch.Tensor
    x_solver: str
    nmse: float
    consensus: float

    @property
    def n_agents(self) -> int:
        return self.x.shape[1]


def record_incremental_fit(blocks, graph, rank, *, x_solver="pi_admm", **fit_kw) -> TokenRecording:
    """Run :func:`~ppdnmf_torch.fit` with the incremental X-step and record its tokens.

    The start is the paper's public all-ones ``X^0`` unless ``init`` says otherwise: the
    adversaries assume they know it (the premise of recursion (11))."""
    fit_kw.setdefault("init", "ones")
    if fit_kw["init"] != "ones":
        raise ConfigError("init: the token audit's adversaries assume the public all-ones start (init=ones)")
    if x_solver == "admm":
        raise ConfigError("x_solver: the token audit needs an incremental X-step (i_admm, pi_admm, pi_admm2)")
    ex = make_exchange(PlainSpec(), mixin=TokenRecorder)
    res = fit(blocks, graph, rank, exchange=ex, x_solver=x_solver, **fit_kw)
    recs = ex.token_records
    tokens, agents, xs, ys = [recs[0]["tokens"][:, 0]], [], [recs[0]["x"][:, 0]], [recs[0]["y"][:, 0]]
    for r in recs:
        agents.append(r["agents"][:, 0])
    for prev, r in zip(recs, recs[1:]):
        # one walk: each X-step starts from the last one's token and states
        assert torch.equal(prev["tokens"][-1], r["tokens"][0])
        tokens.append(r["tokens"][1:, 0])
        xs.append(r["x"][1:, 0])
        ys.append(r["y"][1:, 0])
    order = tuple(int(v) for v in recs[0]["order"][0])
    x = torch.cat(xs).double()
    return TokenRecording(torch.cat(tokens).double(), torch.cat(agents), x, torch.cat(ys).double(), order,
                          relay_routes(res.graph, order), float(recs[0]["rho"]), torch.ones_like(x[0]), x_solver,
                          float(res.history["nmse"][-1]), float(res.history["consensus"][-1]))


def _rel(est, true):
    """Per-agent relative Frobenius errors ``(..., n)`` of ``(..., n, L, K)`` tensors."""
    num = (est - true).flatten(-2).norm(dim=-1)
    return num / true.flatten(-2).norm(dim=-1).clamp_min(torch.finfo(true.dtype).tiny)


def _stats(v) -> dict:
    v = torch.as_tensor(v, dtype=torch.float64).reshape(-1)
    return {"median": float(v.median()), "max": float(v.max()), "exact": int((v < EXACT_REL).sum()),
            "of": int(v.numel())}


def eavesdropper_incremental(rec: TokenRecording, *, lsqr: bool = True, target: int = 0, coord: int = 0) -> dict:
    """The eavesdropper's attacks (a) on a recording; see the module docstring."""
    n, rho, P = rec.n_agents, rec.rho, project_nonnegative
    u_true = rec.x - rec.y / rho
    u = eavesdrop_offsets(rec.tokens, rec.agents, n, u0=rec.u0)
    out = {"offsets_u": _stats(_rel(u, u_true).amax(0))}
    xr, yr = eavesdrop_recursion(rec.tokens, rec.agents, n, rho, x0=rec.u0, y0=torch.zeros_like(rec.u0),
                                 projection=P)
    out["recursion_x"] = _stats(_rel(xr, rec.x).amax(0))
    out["recursion_y"] = _stats(_rel(yr, rec.y).amax(0))
    zf = P(rec.tokens[-1])
    out["consensus_x"] = _stats(_rel(zf.expand_as(rec.x[-1]), rec.x[-1]))
    out["consensus_y"] = _stats(_rel(rho * (zf - u[-1]), rec.y[-1]))
    if lsqr:
        out["lsqr"] = {}
        for name, kw in (("converged", {}), ("matlab_defaults", MATLAB_LSQR)):
            at = lsqr_attack(rec.tokens, rec.agents, n, rho, target=target, coord=coord, projection=P,
                             u0=rec.u0, **kw)
            xt = float(rec.x[-1, target].reshape(-1)[coord])
            yt = float(rec.y[-1, target].reshape(-1)[coord])
            out["lsqr"][name] = {"x_err": abs(float(at.x[-1]) - xt), "y_err": abs(float(at.y[-1]) - yt),
                                 "x_true": xt, "y_true": yt, "rows": at.n_rows, "unknowns": at.n_cols,
                                 "itn": at.itn}
    return out


def _observations(rec: TokenRecording, i: int) -> list[int]:
    """The token indices ``k`` at which agent ``i`` sees ``z^k`` (0: the public start)."""
    seen = {0}
    pos = {a: k for k, a in enumerate(rec.order)}
    agents = rec.agents.tolist()
    for k, a in enumerate(agents):
        if a == i:
            seen.update((k, k + 1))  # receives z^k, computes and sends z^(k+1)
        elif i in rec.routes[pos[a]]:
            seen.add(k + 1)  # relays z^(k+1) towards the next agent
    return sorted(s for s in seen if s <= len(agents))


def curious_agent_incremental(rec: TokenRecording) -> dict:
    """Every agent as the curious agent (b) against its predecessor in the visiting order."""
    n, rho, N = rec.n_agents, rec.rho, rec.n_agents
    u_true = rec.x - rec.y / rho
    agents = rec.agents.tolist()
    errs = {"u": [], "x": [], "y": []}
    exact_agents = []
    for i in range(n):
        p = rec.order[(rec.order.index(i) - 1) % n]
        obs = _observations(rec, i)
        u_est = rec.u0.clone()
        for s, e in zip(obs, obs[1:]):
            others = sorted({a for a in agents[s:e] if a != i})
            if not others:
                continue
            D = N * (rec.tokens[e] - rec.tokens[s]) - (u_true[e, i] - u_true[s, i])
            for j in others:
                u_est[j] += D / len(others)
        k = obs[-1]
        xp = project_nonnegative(rec.tokens[k])
        yp = rho * (xp - u_est[p])
        eu = float(_rel(u_est[p][None], u_true[k, p][None])[0])
        errs["u"].append(eu)
        errs["x"].append(float(_rel(xp[None], rec.x[k, p][None])[0]))
        errs["y"].append(float(_rel(yp[None], rec.y[k, p][None])[0]))
        if eu < EXACT_REL:
            exact_agents.append(i)
    return {"predecessor_u": _stats(errs["u"]), "predecessor_x": _stats(errs["x"]),
            "predecessor_y": _stats(errs["y"]), "exact_u_attackers": exact_agents}


def incremental_audit(scenarios, *, methods=("i_admm", "pi_admm", "pi_admm2"), lsqr: bool = True,
                      progress=None, **fit_kw) -> dict:
    """Both adversaries on every ``(scenario, method)``.

    Parameters
    ----------
    scenarios : dict name -> (blocks, graph, rank)
    methods : sequence of x_solver names
    fit_kw
        Keywords of :func:`~ppdnmf_torch.fit` (iterations, ``x_rho``, ...).

    Returns
    -------
    dict
        ``{scenario: {method: {"fit", "hops_per_round", "eavesdropper", "curious", "seconds"}}}``.
    """
    say = progress or (lambda s: None)
    out = {}
    for name, (blocks, graph, rank) in scenarios.items():
        out[name] = {}
        for m in methods:
            t0 = time.perf_counter()
            say(f"[{name}] {m}: recording the tokens")
            rec = record_incremental_fit(blocks, graph, rank, x_solver=m, **fit_kw)
            entry = {"fit": {"nmse": rec.nmse, "consensus": rec.consensus}, "steps": int(rec.agents.numel()),
                     "order": list(rec.order), "relays": int(sum(len(r) for r in rec.routes))}
            say(f"[{name}] {m}: eavesdropper and curious agents")
            entry["eavesdropper"] = eavesdropper_incremental(rec, lsqr=lsqr)
            entry["curious"] = curious_agent_incremental(rec)
            entry["seconds"] = time.perf_counter() - t0
            out[name][m] = entry
    return out
