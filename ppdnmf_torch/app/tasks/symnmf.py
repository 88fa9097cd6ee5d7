"""The symmetric-NMF task: how the app runs :mod:`ppdnmf_torch.models.symnmf` (``ppdnmf task=symnmf``).

Two variants (``symnmf/variant=``): ``centralized`` (:func:`~ppdnmf_torch.models.symnmf.fit.fit_symnmf`,
the ``solver`` section, :class:`~ppdnmf_torch.models.symnmf.config.SymNMFSpec`) and ``agents``
(:func:`~ppdnmf_torch.models.symnmf.agents.fit_symnmf_agents`, the ``agents`` section,
:class:`~ppdnmf_torch.models.symnmf.config.AgentsSpec`, over the ``graph`` and through the
``exchange`` groups PPDNMF has; over ranks with any ``distributed.*`` key,
:func:`~ppdnmf_torch.models.symnmf.distributed.fit_symnmf_rank`). The task is an adapter: the
specs are the model's, the data presets and the fit are the model's
:func:`~ppdnmf_torch.models.symnmf.presets.run_preset`.

1. :meth:`SymNMFTask.build_inputs`: the device and dtype, and the agents' graphs (one per trial);
2. :meth:`SymNMFTask.fit`: ``run_preset`` with the trials batched in one fit; every iteration's
   scalars (``symnmf/E``, ``symnmf/objective``, ``symnmf/lambda``, ...; with labels ``symnmf/accuracy``,
   ``symnmf/nmi``), their means over trials, to the logger and the progress; the model's
   checkpoints in ``out/checkpoints``;
3. :meth:`SymNMFTask.write_outputs`: one ``.npy`` per array (``U``, ``V``, ``labels``, ...),
   ``history.csv``, the PNG figures (curves, clusters), the images of the reordered similarity and
   of the cluster means in TensorBoard; the summary.
"""
from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ...checkpoint import PREFIX
from ...errors import ConfigError
from ...exchange.spec import ExchangeSpec
from ...models.symnmf.config import AgentsSpec, SymNMFSpec
from ...models.symnmf.presets import PRESETS, run_preset
from ..costs import announcing
from ..figures import write_figures
from ..outputs import write_arrays, write_history_csv
from ..progress import Progress
from . import _common as common
from ._common import (DeviceInputs, GraphConfig, ModelFits, ModelTask, RunKeys, build_exchange, check_variant_sections,
                      rule)

__all__ = ["TASK", "SymNMFTask", "SymNMFRunConfig", "SymNMFData", "CONFIG_KEYS", "VARIANTS"]

#: the variants of ``symnmf/variant=``
VARIANTS = ("centralized", "agents")


@dataclass
class SymNMFData:
    """A preset: ``synthetic`` (``X = U* U*^T + sigma |N|``, ``n`` x ``n``), ``orl`` (``path``:
    ``orl_faces.mat``), ``digits``, a user's ``samples`` (rows) or ``similarity`` (``path``:
    ``.npy``/``.csv``, or ``.npz`` for a sparse similarity), with ``labels_path`` optional."""

    preset: str = rule("synthetic", choices=PRESETS)
    path: str | None = None
    labels_path: str | None = None
    n: int = rule(300, ge=2)
    sigma: float = rule(0.1, ge=0)
    # neighbours of Kuang et al.'s similarity of samples (null: its default)
    n_neighbors: int | None = rule(None, ge=1)


@dataclass
class SymNMFRunConfig(RunKeys):
    """One ``ppdnmf task=symnmf`` run (``conf/task/symnmf.yaml`` and ``conf/symnmf/``)."""

    task: str = rule("symnmf", choices=("symnmf",))
    variant: str = rule("centralized", choices=VARIANTS)
    # r (null: the number of classes of a labelled preset, 20 otherwise)
    rank: int | None = rule(None, ge=1)
    data: SymNMFData = field(default_factory=SymNMFData)
    solver: SymNMFSpec = field(default_factory=SymNMFSpec)
    # variant=agents: the fit across agents, their graph and exchange
    agents: AgentsSpec | None = None
    graph: GraphConfig | None = None
    exchange: ExchangeSpec | None = rule(None, build=build_exchange)

    def validate(self) -> "SymNMFRunConfig":
        return common.validate(self, _cross)


def _cross(cfg: SymNMFRunConfig) -> None:
    d = cfg.data
    if d.preset in ("orl", "samples", "similarity") and not d.path:
        raise ConfigError(f"data.path: data.preset={d.preset} needs a file")
    lam = cfg.solver.penalty
    if isinstance(lam, list) and len(lam) not in (1, cfg.trials):
        raise ConfigError(f"solver.penalty: a list needs one value per trial ({cfg.trials}), got {len(lam)}")
    sections = {"agents": cfg.agents, "graph": cfg.graph, "exchange": cfg.exchange}
    check_variant_sections("symnmf", "agents", "agents", cfg.variant == "agents", sections,
                           cfg.exchange.kind if cfg.exchange is not None else None)
    if cfg.variant == "agents" and cfg.agents.min_degree != cfg.graph.min_degree:
        raise ConfigError("agents.min_degree: set it as graph.min_degree (the graph's rule)")


#: the API's parameter names and the config keys they come from
CONFIG_KEYS = {"path": "data.path", "labels_path": "data.labels_path", "n": "data.n", "preset": "data.preset", "method": "solver.method", "penalty": "solver.penalty",
               "lam0": "solver.lam0", "max_iter": "solver.max_iter", "tol": "solver.tol", "rank": "rank",
               "checkpoint_dir": "resume", "n_agents": "agents.n_agents", "mu": "agents.mu", "g_cap": "agents.g_cap",
               "x_iters": "agents.x_iters", "y_iters": "agents.y_iters", "min_degree": "graph.min_degree",
               "aggregation": "agents.aggregation", "penalty_schedule": "agents.penalty_schedule",
               "labels_path": "data.labels_path"}
#: the same for the variant across agents
AGENTS_KEYS = {**CONFIG_KEYS, "penalty": "agents.penalty", "lam0": "agents.lam0", "max_iter": "agents.max_iter",
               "tol": "agents.tol"}


def _announcing(cfg: SymNMFRunConfig, inputs: DeviceInputs, fit, iterations: int):
    """The fit across agents (``fit``, or the one-process :func:`~ppdnmf_torch.models.symnmf.agents.fit_symnmf_agents`
    with the trials and device :func:`~ppdnmf_torch.models.symnmf.presets.run_preset` would pass it) that
    first logs the Paillier estimate: ``x_iters`` exchange calls per iteration (app/costs.py)."""
    if fit is None:
        from ...models.symnmf.agents import fit_symnmf_agents

        fit = functools.partial(fit_symnmf_agents, trials=cfg.trials, device=inputs.device)
    return announcing(fit, cfg.exchange, inputs.graphs, cfg.agents.x_iters * max(0, iterations))


def _info(k, metrics):
    """A fit across agents reports ``(k, metrics)``; the app's callbacks take one object."""
    return SimpleNamespace(k=k, iteration=k, metrics=metrics)


class SymNMFTask(ModelTask):
    """Symmetric NMF as the app runs it."""

    name = "symnmf"
    config_cls = SymNMFRunConfig
    cross = staticmethod(_cross)
    config_keys = CONFIG_KEYS
    #: the iteration caps a resumed run may raise (the model's checkpoints allow another cap)
    resume_safe_keys = ("solver.max_iter", "agents.max_iter")
    checkpoint_patterns = (f"{PREFIX}[0-9]*.pt",)
    step = "iteration"

    def keys_of(self, cfg) -> dict:
        return AGENTS_KEYS if getattr(cfg, "variant", None) == "agents" else CONFIG_KEYS

    def iteration_cap(self, cfg) -> tuple:
        return ("agents.max_iter", cfg.agents.max_iter) if cfg.variant == "agents" else ("solver.max_iter",
                                                                                        cfg.solver.max_iter)

    def n_agents(self, cfg) -> int:
        if cfg.variant != "agents":
            raise ConfigError("variant: a run over ranks places agents on ranks; the centralized fit is one process "
                              "(use symnmf/variant=agents, or leave the distributed.* settings out)")
        return cfg.agents.n_agents

    def resume_point(self, resume_from) -> int:
        return common.resume_point(resume_from)

    def build_inputs(self, cfg: SymNMFRunConfig) -> DeviceInputs:
        inputs = super().build_inputs(cfg)
        if cfg.variant == "agents":
            inputs.graphs = common.make_graphs(cfg.graph, cfg.agents.n_agents,
                                               [cfg.seed + t for t in range(cfg.trials)])
        return inputs

    def _fit_kwargs(self, cfg: SymNMFRunConfig, inputs: DeviceInputs, out: Path, resume: bool) -> dict:
        # checkpoint_every=0: the model's checkpoints at the end and on Ctrl-C only (as PPDNMF's)
        ckpt = {"checkpoint_dir": out / "checkpoints", "checkpoint_every": cfg.checkpoint_every, "resume": resume}
        if cfg.variant == "agents":
            a = {k: v for k, v in asdict(cfg.agents).items() if k not in ("exchange", "min_degree")}
            return {**a, **ckpt, "exchange": cfg.exchange, "min_degree": cfg.graph.min_degree,
                    "dtype": inputs.dtype}
        s = {k: v for k, v in asdict(cfg.solver).items() if k != "init"}
        return {**s, **ckpt, "dtype": inputs.dtype}

    def fit(self, cfg: SymNMFRunConfig, inputs: DeviceInputs, logger, out: Path, *, show: bool, callback=None,
            resume_from=None, rank_fit=None, announce: bool = True) -> ModelFits:
        """Step 2; ``rank_fit``: a rank's fit across agents (``functools.partial(fit_symnmf_rank,
        comm, ...)``, :meth:`run_rank`), whose result is None on the ranks other than 0;
        ``announce``: say a Paillier run's estimate before it starts (rank 0's)."""
        s, d, agents = cfg.solver, cfg.data, cfg.variant == "agents"
        start = self.resume_point(out / "checkpoints") if resume_from is not None else 0
        total = cfg.agents.max_iter if agents else s.max_iter
        where = f", {cfg.agents.n_agents} agents" if agents else ""
        label = f"SymNMF ({d.preset}, {'agents' if agents else s.method}{where}" + (
            f", {cfg.trials} trials)" if cfg.trials > 1 else ")")
        with Progress(show, total, label, interval=cfg.progress_interval, start=start, step=self.step) as bar:

            def log_scalars(k, values):
                means = {tag.lstrip("/"): v for tag, v in common.trial_means(values, "").items()}
                logger.scalars(k, means)
                if "symnmf/E" in means:  # the labels' scores come in a second call
                    shown = {"E": means["symnmf/E"], "lambda": means.get("symnmf/lambda")}
                    if "symnmf/rel_gap_UV" in means:
                        shown["||U-V||/||V||"] = means["symnmf/rel_gap_UV"]
                    if "symnmf/consensus" in means:
                        shown["consensus"] = means["symnmf/consensus"]
                    bar.update(k, shown)

            user_cb = None
            if callback is not None:
                user_cb = (lambda k, m: callback(_info(k, m))) if agents else callback
            kwargs = self._fit_kwargs(cfg, inputs, out, resume_from is not None)
            if rank_fit is not None:
                kwargs.update(graph=inputs.graphs[0], fit=rank_fit)
            elif agents:
                kwargs["graph"] = inputs.graphs
            if agents and cfg.exchange.kind == "paillier" and announce:
                kwargs["fit"] = _announcing(cfg, inputs, kwargs.get("fit"), total - start)
            t0 = time.perf_counter()
            out_ = run_preset(d.preset, cfg.rank, path=d.path, labels_path=d.labels_path, n=d.n, sigma=d.sigma,
                              n_neighbors=d.n_neighbors, init=s.init, seed=cfg.seed, trials=cfg.trials,
                              log_scalars=log_scalars, device=inputs.device, callback=user_cb, agents=agents, **kwargs)
        if out_ is None:  # a rank other than 0
            return None
        summary, arrays = out_
        return ModelFits(summary, arrays, time.perf_counter() - t0)

    def write_outputs(self, cfg: SymNMFRunConfig, inputs: DeviceInputs, fits: ModelFits, out: Path,
                      logger) -> dict:
        arrays = fits.arrays
        histories = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("history/")}
        # the reordered similarity is an image (n x n), not an output of the fit
        write_arrays(out, {k: v for k, v in arrays.items()
                           if not k.startswith("history/") and k != "reordered_similarity"})
        write_history_csv(out / "history.csv", histories)
        s = fits.summary
        n_iter = max(s["n_iter"])
        if cfg.logger.images:
            if "reordered_similarity" in arrays:
                logger.image("images/reordered_similarity", arrays["reordered_similarity"], n_iter)
            if "cluster_mean_images" in arrays:
                logger.image("images/cluster_means", arrays["cluster_mean_images"], n_iter,
                             scale=cfg.logger.image_scale, normalize=True)
        figures = write_figures(out, histories, title=f"SymNMF on {cfg.data.preset}",
                                curves=("E", "objective", "rel_gap", "uv_dist", "consensus", "lam", "lambda"),
                                clusters=arrays.get("reordered_similarity"), sizes=arrays.get("cluster_sizes"),
                                images=arrays.get("cluster_mean_images"), images_title="cluster means")
        summary = {"task": self.name, "variant": cfg.variant, "name": cfg.name, "data": cfg.data.preset,
                   "seed": cfg.seed, "device": str(inputs.device), "dtype": cfg.dtype, **s,
                   "wall_time": {"fit": fits.seconds, "solver": s.get("wall_time")}, "figures": figures,
                   "out_dir": str(out)}
        if cfg.variant == "agents":
            summary.update(graph=cfg.graph.kind, exchange=cfg.exchange.kind)
        summary = json.loads(json.dumps(summary, default=str))
        hp = {"name": cfg.name, "variant": cfg.variant, "data": cfg.data.preset,
              "method": cfg.solver.method if cfg.variant == "centralized" else "agents",
              "penalty": str(s["penalty"]), "rank": s["rank"], "n": s["n"], "trials": cfg.trials, "seed": cfg.seed,
              "init": cfg.solver.init, "dtype": cfg.dtype}
        metrics = {"E": common.mean(s["E"]), "rel_gap_UV": common.mean(s["rel_gap"]), "n_iter": n_iter,
                   "wall_time": fits.seconds,
                   **({"accuracy": common.mean(s["accuracy"]), "nmi": common.mean(s["nmi"])} if "accuracy" in s else {})}
        logger.finished(None, None, hparams=hp, metrics=metrics,
                        config_text="```\n" + json.dumps(self.config_to_dict(cfg), indent=2) + "\n```")
        return summary

    def run_rank(self, cfg: SymNMFRunConfig, out: Path, comm, logger, *, partition="rcm", assignment=None,
                 share="all", resume=False, callback=None) -> dict | None:
        """One rank of ``task=symnmf variant=agents`` over ranks
        (:func:`~ppdnmf_torch.models.symnmf.distributed.fit_symnmf_rank`): every rank loads the
        preset and keeps its agents' columns; rank 0 writes the outputs and returns the summary."""
        from ...models.symnmf.distributed import fit_symnmf_rank

        self.n_agents(cfg)
        base = self.build_inputs(cfg)
        inputs = DeviceInputs(comm.device, base.dtype, base.graphs)
        fit = functools.partial(fit_symnmf_rank, comm, partition=partition, assignment=assignment, share=share,
                                threads=cfg.threads)
        fits = self.fit(cfg, inputs, logger, out, show=cfg.progress and comm.rank == 0, callback=callback,
                        resume_from=out / "checkpoints" if resume else None, rank_fit=fit, announce=comm.rank == 0)
        if fits is None:
            return None
        summary = self.write_outputs(cfg, inputs, fits, out, logger)
        summary["distributed"] = {"world_size": comm.world_size, "partition": partition, "share": share}
        return summary

    def format_summary(self, summary: dict) -> str:
        s = summary
        conv = sum(bool(c) for c in s["converged"])
        how = (f"across {s['n_agents']} agents ({s['graph']} graph, exchange {s['exchange']}), penalty {s['penalty']}"
               if s.get("variant") == "agents" else f"{s['method']} with penalty {s['penalty']}")
        lines = [f"SymNMF on {s['data']} (n = {s['n']}, rank {s['rank']}), {how}, {s['trials']} trial(s)",
                 f"  E {common.stat(s['E'], '.6g')} | ||U - V||/||V|| {common.stat(s['rel_gap'], '.3g')} | "
                 f"iterations {common.stat(s['n_iter'], 'g')} | converged {conv}/{len(s['converged'])}"]
        if "consensus" in s:
            lines.append(f"  consensus {common.stat(s['consensus'], '.3g')}")
        if "accuracy" in s:
            lines.append(f"  clustering accuracy {common.stat(s['accuracy'])} | NMI {common.stat(s['nmi'])}")
        ranks = f", {s['distributed']['world_size']} ranks" if s.get("distributed") else ""
        lines += [f"wall time: fit {s['wall_time']['fit']:.2f} s ({s['device']}, {s['dtype']}{ranks})",
                  f"outputs: {s['out_dir']}"]
        return "\n".join(lines)

    def objective(self, summary: dict) -> float:
        """The final fitting error ``E`` (its mean over trials)."""
        return common.mean(summary["E"])


#: the task :mod:`ppdnmf_torch.app.tasks` finds under ``task=symnmf``
TASK = SymNMFTask()
