"""The incremental consensus engine: I-ADMM, PI-ADMM1, PI-ADMM2 and W-ADMM, batched over trials.

The steps of one walk are sequential; the trials (seeds, hyperparameters) of a batch run
side by side as the leading dimension. A whole round of ``N`` steps is the unit of work:
one block of random draws per trial, one (optionally compiled) call of
:func:`.step.run_round`, one record of the history.
"""
from __future__ import annotations

import warnings

import torch

from ..errors import ConfigError
from .losses import LocalLoss
from .methods import make_method
from .params import (batch_size, check_tensor, length_of, per_trial, resolve_cycles,
                     resolve_neighbors, trial_seeds)
from .randomness import TrialStreams
from .result import IncrementalResult, IncrementalState, RoundInfo, Transcript
from .step import run_round, token_step

__all__ = ["IncrementalADMM", "run_incremental", "COMPILE_MODES"]

COMPILE_MODES = ("none", "step", "round")


class IncrementalADMM:
    """I-ADMM and its private variants for ``min_x sum_i f_i(x)`` over a Hamiltonian cycle.

    Parameters
    ----------
    loss : LocalLoss
        The ``f_i``; its device and dtype are the run's.
    method : str or Method
        "i_admm", "pi_admm1", "pi_admm2", "w_admm" (see :mod:`.methods`; keywords in
        ``method_params``) or a :class:`Method`.
    rho : float or sequence (B,)
        The penalty of the augmented Lagrangian, per trial.
    seeds : int or sequence (B,)
        Per-trial seeds (an int ``s`` gives ``s, s+1, ...``).
    graph : Graph or sequence of Graph, optional
        The network: its Hamiltonian cycle is found when ``cycle`` is not given; the random
        walk needs it.
    cycle : sequence of int, or (B, N) nested sequence, optional
        The cycle(s), validated against ``graph`` when given. With neither ``graph`` nor
        ``cycle`` the agents are taken as numbered along the cycle.
    projection : callable, optional
        ``P``: agents use ``P(z)`` (e.g. ``max(z, 0)``); the token keeps the plain average.
        Not covered by the paper's analysis.
    x_star : Tensor (B, *shape) or (*shape), optional
        The solution, for the accuracy history.
    initial_state : IncrementalState, optional
        Overrides the method's start (a warm start).
    compile : {"none", "step", "round"} or bool
        "step" compiles one step (one graph for every agent), "round" a whole round of
        ``N`` steps as one ``torch.compile`` d graph (True); eager is the default because a
        cold compile costs far more than short runs save (measured in docs/PERFORMANCE.md).
    **method_params
        Keywords of the method's constructor when ``method`` is a name.

    Raises
    ------
    ConfigError, GraphError, DataError
        For bad input, naming the parameter.
    """

    def __init__(self, loss, method="i_admm", rho=1.0, *, seeds=0, graph=None, cycle=None,
                 projection=None, x_star=None, initial_state=None, compile="none", **method_params):
        if not isinstance(loss, LocalLoss):
            raise ConfigError(f"loss: expected a LocalLoss, got {type(loss).__name__}")
        self.method = m = make_method(method, **method_params)
        self.loss, self.n_agents, self.shape = loss, loss.n_agents, tuple(loss.shape)
        self.device, self.dtype = loss.device, loss.dtype
        B = self.batch = self._batch(loss, rho, seeds, graph, cycle, x_star)
        if m.step == "exact" and not loss.has_exact_step:
            raise ConfigError(f"method: step='exact' but {type(loss).__name__} has no exact step; "
                              "use step='linearized'")
        if projection is not None and not callable(projection):
            raise ConfigError(f"projection: expected a callable or None, got {type(projection).__name__}")
        self.projection = projection
        self.compile = self._compile_mode(compile)
        self.rho_list = per_trial(rho, B, "rho", low=0.0)
        self._ones = (1,) * len(self.shape)
        self.rho = torch.tensor(self.rho_list, dtype=self.dtype, device=self.device).view(B, *self._ones)
        self._gamma_bounds(m)
        self.sigma_list = per_trial(m.sigma, B, "sigma", low=0.0, strict_low=False)
        self.sigma = torch.tensor(self.sigma_list, dtype=self.dtype, device=self.device).view(1, B, *self._ones)
        self.streams = TrialStreams(trial_seeds(seeds, B))
        self._walk(graph, cycle)
        self.x_star = None if x_star is None else check_tensor(
            x_star, (B, *self.shape), "x_star", self.device, self.dtype)
        self._init_state(initial_state)
        self.rounds = self.steps = 0
        self._compiled = None

    # -- setup -------------------------------------------------------------------------
    def _batch(self, loss, rho, seeds, graph, cycle, x_star) -> int:
        m = self.method
        named = {"loss": loss.batch_size, "rho": length_of(rho), "seeds": length_of(seeds),
                 "sigma": length_of(m.sigma), "gamma_spread": length_of(m.gamma_spread),
                 "graph": None if graph is None or not isinstance(graph, (list, tuple)) else len(graph),
                 "cycle": len(cycle) if cycle is not None and length_of(cycle[0]) is not None else None,
                 "x_star": None if x_star is None or not isinstance(x_star, torch.Tensor)
                 or x_star.ndim == len(loss.shape) else x_star.shape[0]}
        for name in ("start", "gamma"):
            v = getattr(m, name)
            if v is not None:
                named[f"{name}[0]"], named[f"{name}[1]"] = length_of(v[0]), length_of(v[1])
        return batch_size(named)

    @staticmethod
    def _compile_mode(mode) -> str:
        if mode is True:
            return "round"
        if mode is False or mode is None:
            return "none"
        if mode not in COMPILE_MODES:
            raise ConfigError(f"compile: unknown mode {mode!r}; use one of {COMPILE_MODES} or a bool")
        return mode

    def _gamma_bounds(self, m):
        B = self.batch
        self.gamma_low = self.gamma_high = None
        if m.gamma is not None:
            lo = per_trial(m.gamma[0], B, "gamma[0]", low=0.0)
            hi = per_trial(m.gamma[1], B, "gamma[1]", low=0.0)
        elif m.gamma_spread is not None:
            a = per_trial(m.gamma_spread, B, "gamma_spread", low=0.0, strict_low=False)
            lo = [1.0 - s / r for s, r in zip(a, self.rho_list)]
            hi = [1.0 + s / r for s, r in zip(a, self.rho_list)]
            bad = [(r, s) for r, s, low in zip(self.rho_list, a, lo) if low <= 0]
            if bad:
                raise ConfigError(f"rho: gamma ~ U(1 - spread/rho, 1 + spread/rho) needs rho > spread to "
                                  f"keep gamma > 0; got rho={bad[0][0]}, spread={bad[0][1]}")
        else:
            return
        if any(h < l for l, h in zip(lo, hi)):
            raise ConfigError(f"gamma: needs low <= high, got {list(zip(lo, hi))[:3]}")
        self.gamma_low, self.gamma_high = lo, hi

    def _walk(self, graph, cycle):
        n, B = self.n_agents, self.batch
        self.rows = torch.arange(B, device=self.device)
        if self.method.walk == "random":
            if cycle is not None:
                raise ConfigError("cycle: the random walk (W-ADMM) takes no cycle")
            self.neighbors = resolve_neighbors(graph, n, B)
            self.current = self.streams.first_agents(n)
            self.cycles = None
            return
        self.cycles = resolve_cycles(graph, cycle, n, B)
        if len(set(self.cycles)) == 1:
            self._agents = list(self.cycles[0])
        else:
            self._agents = torch.tensor(self.cycles, dtype=torch.long, device=self.device).T.contiguous()

    def _init_state(self, initial: IncrementalState | None):
        B, n, shp = self.batch, self.n_agents, self.shape
        full = (B, n, *shp)
        if initial is not None:
            if not isinstance(initial, IncrementalState):
                raise ConfigError(f"initial_state: expected an IncrementalState, got {type(initial).__name__}")
            self.x = check_tensor(initial.x, full, "initial_state.x", self.device, self.dtype)
            self.y = check_tensor(initial.y, full, "initial_state.y", self.device, self.dtype)
            self.z = (self.x - self.y / self.rho.unsqueeze(1)).mean(1) if initial.z is None else \
                check_tensor(initial.z, (B, *shp), "initial_state.z", self.device, self.dtype)
            return
        start = self.method.start
        if start is None:
            self.x = torch.zeros(full, dtype=self.dtype, device=self.device)
            self.y = torch.zeros_like(self.x)
        else:
            lo = per_trial(start[0], B, "start[0]")
            hi = per_trial(start[1], B, "start[1]")
            if any(h < l for l, h in zip(lo, hi)):
                raise ConfigError(f"start: needs low <= high, got {start!r}")
            # Algorithm 2: x_i^0 private, y_i^0 = rho x_i^0, so sum_i (x_i^0 - y_i^0 / rho) = 0 = N z^0
            self.x = self.streams.start_values(n, shp, lo, hi).to(device=self.device, dtype=self.dtype)
            self.y = self.rho.unsqueeze(1) * self.x
        self.z = torch.zeros((B, *shp), dtype=self.dtype, device=self.device)

    # -- state -------------------------------------------------------------------------
    def set_loss(self, loss: LocalLoss) -> None:
        """Swap the local losses, keeping ``x``, ``y``, ``z`` (warm start across BCD iterations)."""
        if not isinstance(loss, LocalLoss) or loss.n_agents != self.n_agents or tuple(loss.shape) != self.shape:
            raise ConfigError(f"loss: expected a LocalLoss with {self.n_agents} agents and shape {self.shape}")
        if loss.batch_size not in (1, self.batch) or self.method.step == "exact" and not loss.has_exact_step:
            raise ConfigError(f"loss: batch size {loss.batch_size} or its steps do not fit this engine")
        # the compiled round takes the loss as an input: same class and shapes reuse its graph
        self.loss = loss

    def load_state(self, state: IncrementalState) -> None:
        """Overwrite ``x``, ``y``, ``z`` in place with ``state``'s (a warm start that keeps the
        compiled round: the same tensors go in). ``state.z`` None: from the invariant."""
        if not isinstance(state, IncrementalState):
            raise ConfigError(f"state: expected an IncrementalState, got {type(state).__name__}")
        B, n, shp = self.batch, self.n_agents, self.shape
        x = check_tensor(state.x, (B, n, *shp), "state.x", self.device, self.dtype)
        y = check_tensor(state.y, (B, n, *shp), "state.y", self.device, self.dtype)
        z = (x - y / self.rho.unsqueeze(1)).mean(1) if state.z is None else \
            check_tensor(state.z, (B, *shp), "state.z", self.device, self.dtype)
        self.x.copy_(x)
        self.y.copy_(y)
        self.z.copy_(z)

    def reseed(self, seeds) -> None:
        """Fresh random streams from ``seeds`` (an int ``s``: ``s, s+1, ...``; or ``B`` ints),
        e.g. one set per PPDNMF X-step, so that a step's draws depend on its seeds only."""
        self.streams = TrialStreams(trial_seeds(seeds, self.batch))
        if self.cycles is None:
            self.current = self.streams.first_agents(self.n_agents)

    @property
    def state(self) -> IncrementalState:
        """A copy of the current ``x``, ``y``, ``z``."""
        return IncrementalState(self.x.clone(), self.y.clone(), self.z.clone())

    def _token_used(self):
        return self.z if self.projection is None else self.projection(self.z)

    def _metrics(self):
        zt = self._token_used()
        cons = (self.x - zt.unsqueeze(1)).square().flatten(2).sum(-1).mean(-1)
        acc = None if self.x_star is None else \
            (self.x - self.x_star.unsqueeze(1)).square().flatten(2).sum(-1).mean(-1)
        return acc, cons

    # -- rounds ------------------------------------------------------------------------
    def _draw_round(self):
        """This round's agents, ``rho gamma`` and noises: fixed blocks of every trial's streams."""
        n, B = self.n_agents, self.batch
        if self.cycles is None:
            walk, self.current = self.streams.walk_round(n, self.current, self.neighbors)
            agents = walk.to(self.device)
        else:
            agents = self._agents
        cs = None
        if self.gamma_low is not None:
            g = self.streams.gammas(n, self.gamma_low, self.gamma_high).to(device=self.device, dtype=self.dtype)
            cs = self.rho.view(1, B, *self._ones) * g.view(n, B, *self._ones)
        noises = None
        if any(s > 0 for s in self.sigma_list):
            noises = self.sigma * self.streams.noises(n, self.shape).to(device=self.device, dtype=self.dtype)
        return agents, cs, noises

    def _round(self, record: bool, watch):
        agents, cs, noises = self._draw_round()
        fn, step = run_round, token_step
        if self.compile == "round":
            if self._compiled is None:
                self._compiled = torch.compile(run_round, dynamic=False)
            fn = self._compiled
        elif self.compile == "step":
            # one graph for every agent: the agent goes in as a tensor, not a Python int
            if self._compiled is None:
                self._compiled = torch.compile(token_step, dynamic=False)
            step = self._compiled
            if not isinstance(agents, torch.Tensor):
                agents = self._agent_tensor(agents)
        out = fn(self.x, self.y, self.z, agents, self.rho, cs, noises, self.loss,
                 self.method.step == "linearized", self.projection, self.rows, record, watch, step)
        self.rounds += 1
        self.steps += self.n_agents
        return agents, out

    def run(self, n_rounds: int, record_every: int = 1, transcript: bool = False, watch=None,
            callback=None) -> IncrementalResult:
        """Run ``n_rounds`` rounds of ``N`` steps (``N`` vectors each), continuing the state.

        Parameters
        ----------
        n_rounds : int
        record_every : int
            Record the history every this many rounds (and at the start and the end).
        transcript : bool
            Keep every token and active agent (:class:`Transcript`).
        watch : sequence of int, optional
            Agents whose ``x``, ``y`` after every step go into the transcript.
        callback : callable ``(RoundInfo) -> bool | None``, optional
            Called at every record; a true return stops the run.

        Returns
        -------
        IncrementalResult
        """
        n_rounds, record_every = self._count(n_rounds, "n_rounds", 0), self._count(record_every, "record_every", 1)
        w = self._watch(watch)
        record = transcript or w is not None
        hist, tokens, agents, xs, ys = [], [self.z.clone().unsqueeze(0)], [], [], []
        if w is not None:
            xs, ys = [self.x[:, w].clone().unsqueeze(0)], [self.y[:, w].clone().unsqueeze(0)]
        stop = self._record(hist, callback)
        for r in range(n_rounds):
            if stop:
                break
            ag, (tk, xw, yw) = self._round(record, w)
            if record:
                tokens.append(tk)
                agents.append(ag.cpu() if isinstance(ag, torch.Tensor) else
                              torch.tensor(ag, dtype=torch.long).unsqueeze(1).expand(-1, self.batch))
                if w is not None:
                    xs.append(xw)
                    ys.append(yw)
            if (r + 1) % record_every == 0 or r + 1 == n_rounds:
                stop = self._record(hist, callback)
        if not bool(torch.isfinite(self.x).all()):
            warnings.warn("IncrementalADMM: the iterates are not finite (the run diverged); for the "
                          "linearised step raise rho", UserWarning, stacklevel=2)
        tr = None
        if record:
            cat = lambda parts: torch.cat(parts).cpu()
            tr = Transcript(cat(tokens), torch.cat(agents) if agents else torch.empty((0, self.batch), dtype=torch.long),
                            None if w is None else w.cpu(), cat(xs) if w is not None else None,
                            cat(ys) if w is not None else None)
        return self._result(hist, tr)

    def _agent_tensor(self, agents):
        if getattr(self, "_agents_t", None) is None:
            self._agents_t = torch.tensor(agents, dtype=torch.long, device=self.device).unsqueeze(1).expand(
                -1, self.batch).contiguous()
        return self._agents_t

    @staticmethod
    def _count(v, name: str, low: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(f"{name}: must be an integer >= {low}, got {v!r}")
        return v

    def _watch(self, watch):
        if watch is None:
            return None
        try:
            w = [int(a) for a in watch]
        except (TypeError, ValueError):
            raise ConfigError(f"watch: expected a sequence of agent ids, got {watch!r}") from None
        if not w or any(not 0 <= a < self.n_agents for a in w):
            raise ConfigError(f"watch: agent ids must lie in 0..{self.n_agents - 1}, got {w}")
        return torch.tensor(w, dtype=torch.long, device=self.device)

    def _record(self, hist, callback) -> bool:
        acc, cons = self._metrics()
        hist.append((self.steps, acc, cons))
        if callback is None:
            return False
        return bool(callback(RoundInfo(self.rounds, self.steps, acc, cons)))

    def _result(self, hist, tr) -> IncrementalResult:
        vectors = torch.tensor([h[0] for h in hist], dtype=torch.long)
        acc = None if self.x_star is None else torch.stack([h[1] for h in hist]).double().cpu()
        cons = torch.stack([h[2] for h in hist]).double().cpu()
        zp = None if self.projection is None else self.projection(self.z).clone()
        return IncrementalResult(self.x.clone(), self.y.clone(), self.z.clone(), zp, vectors, acc, cons, tr,
                                 self.method, self.rho.reshape(-1).clone(), self.steps)


def run_incremental(loss, method="i_admm", rho=1.0, n_rounds: int = 100, *, record_every: int = 1,
                    transcript: bool = False, watch=None, callback=None, **kwargs) -> IncrementalResult:
    """One call: build an :class:`IncrementalADMM` (``kwargs``) and :meth:`~IncrementalADMM.run` it."""
    engine = IncrementalADMM(loss, method, rho, **kwargs)
    return engine.run(n_rounds, record_every=record_every, transcript=transcript, watch=watch,
                      callback=callback)
