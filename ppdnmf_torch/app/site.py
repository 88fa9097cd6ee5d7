"""``ppdnmf site.rank=1 site.world=3 site.rendezvous=host:port site.data=own.npy ...``: one party's
process of a run in which each party holds only its own data (docs/DEPLOYMENT.md).

Every site runs this command with its own ``site.rank`` and ``site.data`` and the same public
description (every other override: the graph, the model's settings, the seed, and
``site.columns``, the column count of every agent). The sites meet over TCP
(``site.rendezvous=host:port``: site 0 listens there; or ``env``: ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` as torchrun sets them), compare their public
descriptions (a site started with another one is refused with one line saying what differs),
and run the model's rank fit with ``share="sums"``: nothing but the protocol, the stopping
rule's flags and the metrics' per-site sums crosses (symmetric NMF's also carry each site's sum
of its agents' copies ``U_i``: :mod:`.site_symnmf`). Each site writes its own run folder: its
agents' factors (``factors.pt``), the history (``history.csv``/``.json``, the same on every
site), TensorBoard scalars, ``summary.json`` (with a ``site`` section), and its checkpoints;
``resume=<its run folder>`` with the same command continues it.

Exit status: 0; 2 for a user error (a bad key, a data file of the wrong shape before connecting,
another public description at rendezvous); 3 when another site failed, died or stopped
answering (the line names it); 130 after Ctrl-C.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from .cli import CONFIG_DIR, EXIT_INTERRUPTED, EXIT_USER_ERROR, to_log_files, to_run_config
from .resume import overridden, resume_target
from .rundir import remove_checkpoints
from ..errors import ConfigError, DataError, PPDNMFError
from ..distributed.comm import BACKENDS, EXIT_PEER_FAILED, STORE_LINGER, Comm, DistributedError, hosts_store
from ..distributed.site import own_agents, site_owner, split_own_columns
from .tasks import task_of

__all__ = ["SiteConfig", "CONFIG_NAME", "main", "rendezvous_url", "load_own_data", "run_site"]

#: the site app's primary config: ``conf/config.yaml`` and the ``site`` section
CONFIG_NAME = "ppdnmf_site"
#: the tasks with a site run, and the variant each needs
SITE_TASKS = ("ppdnmf", "symnmf", "fsspca")


@dataclass
class SiteConfig:
    """The ``site`` section.

    Attributes
    ----------
    rank : int, optional
        This site's number, ``0 .. world-1`` (default: ``RANK`` of the environment).
    world : int, optional
        The number of sites (default: ``WORLD_SIZE`` of the environment).
    rendezvous : str
        ``host:port`` where site 0 listens (every site gives the same; loopback for sites on one
        machine), or ``env`` (``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``).
    data : str
        This site's own data file (``.npy``, ``.csv``, or ``.pt`` holding one tensor): its
        agents' columns side by side, ``(L, sum of its agents' M_i)``.
    columns : list of int
        Every agent's column count ``M_i`` (public: the shapes every site must know).
    assignment : list of int, optional
        The site of every agent (default: agent ``i`` on site ``i``).
    parts : list of list of int, optional
        Symmetric NMF: every agent's nodes ``S_i`` (public; default: contiguous blocks of
        ``columns``, the agents' node counts; :mod:`.site_symnmf`).
    backend : {"auto", "gloo", "nccl"}
    timeout : float
        Seconds the rendezvous and any one exchange may wait for the other sites.
    heartbeat : float
        Seconds without another site's heartbeat before this one gives up (0: no watchdog).
    """

    rank: int | None = None
    world: int | None = None
    rendezvous: str = "env"
    data: str | None = None
    columns: list | None = None
    assignment: list | None = None
    parts: list | None = None
    backend: str = "auto"
    timeout: float = 300.0
    heartbeat: float = 60.0

    def __post_init__(self):
        for name in ("rank", "world"):
            v = getattr(self, name)
            low = 0 if name == "rank" else 1
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
                raise ConfigError(f"site.{name}: must be an integer >= {low}, got {v!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"site.backend: unknown backend {self.backend!r}; use one of {BACKENDS}")
        for name in ("timeout", "heartbeat"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (name == "timeout" and v == 0):
                raise ConfigError(f"site.{name}: must be a number {'>' if name == 'timeout' else '>='} 0, got {v!r}")
        if not isinstance(self.data, str) or not self.data.strip():
            raise ConfigError("site.data: give this site's own data file (site.data=own.npy)")
        if (not isinstance(self.columns, list) or not self.columns
                or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in self.columns)):
            raise ConfigError(f"site.columns: give every agent's column count, integers >= 1 (public, the same on "
                              f"every site), got {self.columns!r}")
        rendezvous_url(self.rendezvous)

    @classmethod
    def from_dict(cls, d: dict | None) -> "SiteConfig":
        d = dict(d or {})
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"site.{unknown[0]}: unknown key; the section takes {sorted(cls.__dataclass_fields__)}")
        return cls(**d)

    def identity(self) -> tuple:
        """``(rank, world)``: the keys, else the environment's ``RANK`` and ``WORLD_SIZE``."""
        out = []
        for name, env in (("rank", "RANK"), ("world", "WORLD_SIZE")):
            v = getattr(self, name)
            if v is None:
                text = os.environ.get(env)
                if text is None:
                    raise ConfigError(f"site.{name}: give it (site.{name}=...), or set {env} as torchrun does")
                v = int(text)
            out.append(v)
        if not out[0] < out[1]:
            raise ConfigError(f"site.rank: {out[0]}, the run has sites 0..{out[1] - 1} (site.world={out[1]})")
        return tuple(out)


ConfigStore.instance().store(name=CONFIG_NAME, node={"defaults": ["config", "_self_"],
                                                      "site": {f.name: f.default for f in fields(SiteConfig)}})


def rendezvous_url(text: str) -> str:
    """``env`` -> ``env://``; ``host:port`` -> ``tcp://host:port`` (a one-line error otherwise)."""
    if text == "env":
        return "env://"
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"site.rendezvous: {text!r} is neither 'env' nor host:port (e.g. 127.0.0.1:29500)")
    return f"tcp://{host}:{port}"


def load_own_data(path: str) -> "object":
    """This site's matrix from ``path`` (``.npy``, ``.csv`` or a ``.pt`` tensor), float64."""
    import numpy as np
    import torch

    full = os.path.normpath(to_absolute_path(os.path.expanduser(path)))
    if not os.path.isfile(full):
        raise DataError(f"no such file: {full!r}", key="site.data")
    try:
        if full.endswith(".npy"):
            Z = torch.from_numpy(np.load(full, allow_pickle=False))
        elif full.endswith(".pt"):
            Z = torch.load(full, map_location="cpu", weights_only=True)
        else:
            Z = torch.from_numpy(np.loadtxt(full, delimiter=",", ndmin=2))
    except (OSError, ValueError, RuntimeError) as exc:
        raise DataError(f"cannot read {full!r}: {' '.join(str(exc).split())[:200]}", key="site.data") from None
    if not isinstance(Z, torch.Tensor):
        raise DataError(f"{full!r} holds a {type(Z).__name__}, not one tensor", key="site.data")
    return Z.to(torch.float64)


def run_site(cfg, opts: SiteConfig, own: dict, out: Path, comm: Comm, *, resume: bool = False,
             callback=None) -> dict:
    """This site's run on ``comm`` (PPDNMF: :func:`~ppdnmf_torch.models.ppdnmf.distributed.fit_site`):
    its own run folder ``out`` (``config.yaml``, ``site.json``, ``factors.pt`` of its agents, the
    history, TensorBoard, ``summary.json``); returns the summary."""
    from .loggers import NullLogger
    from .outputs import write_summary, write_yaml
    from .runner import make_logger
    from .site_ppdnmf import run_ppdnmf_site
    from .site_symnmf import run_symnmf_site

    task = task_of(cfg)
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        (out / "summary.json").unlink(missing_ok=True)
    write_yaml(out / "config.yaml", task.config_to_dict(cfg))
    public = {k: v for k, v in asdict(opts).items() if k not in ("data",)}
    (out / "site.json").write_text(json.dumps(dict(public, rank=comm.rank, world=comm.world_size), indent=2) + "\n")
    logger = make_logger(cfg.logger.kind, out / "tb", flush_secs=cfg.logger.flush_secs) if cfg.logger.kind != "none" \
        else NullLogger()
    try:
        with logger:
            run = run_symnmf_site if task.name == "symnmf" else run_ppdnmf_site
            summary = run(cfg, opts, own, out, comm, logger, resume=resume, callback=callback)
    except PPDNMFError as exc:
        raise exc.renamed(task.keys_of(cfg)) from None
    summary["wall_time"]["total"] = time.perf_counter() - t_start
    write_summary(out / "summary.json", summary)
    return summary


def _compose(cfg: DictConfig) -> DictConfig:
    """Without ``experiment=`` on the command line, the library's defaults (not the paper's preset
    for its synthetic data, which a site's own data is not)."""
    hc = HydraConfig.get()
    if hc.runtime.choices.get("experiment") is not None and "experiment" not in set(overridden(hc.overrides.task)):
        from hydra import compose

        cfg = compose(config_name=CONFIG_NAME, overrides=[*hc.overrides.task, "~experiment"])
    return cfg


def _site_data(given: dict, opts: SiteConfig) -> dict:
    """The run's ``data`` section: this site's file (``npy``) and every agent's columns, whatever
    data the composition brought; ``data.negative`` as given on the command line (else ``error``)."""
    keys = set(overridden(HydraConfig.get().overrides.task))
    negative = given.get("negative", "error") if "data.negative" in keys else "error"
    return {"kind": "npy", "path": opts.data, "negative": negative, "normalize": bool(given.get("normalize", False)),
            "image_shape": given.get("image_shape"), "split": {"lo": None, "hi": None, "counts": list(opts.columns)}}


def _own_blocks(run_cfg, opts: SiteConfig, rank: int, world: int) -> dict:
    """This site's agents' blocks, checked against the public description before connecting."""
    n = task_of(run_cfg).n_agents(run_cfg)
    if len(opts.columns) != n:
        raise ConfigError(f"site.columns: {len(opts.columns)} counts, the run has n_agents={n}")
    owner = site_owner(opts.assignment, n, world)
    Z = load_own_data(opts.data)
    try:
        return split_own_columns(Z, own_agents(owner, rank), opts.columns, key="site.data")
    except PPDNMFError as exc:
        raise exc.renamed({"site.data": f"site.data ({opts.data})"}) from None


def _fail(exc: BaseException, code: int, rank=None) -> None:
    text = " ".join(str(exc).split()) or type(exc).__name__
    print(f"ppdnmf: error: {text}", file=sys.stderr, flush=True)
    to_log_files(f"error: {text}", level=logging.ERROR)
    logging.shutdown()
    if code == EXIT_PEER_FAILED and rank is not None and hosts_store(rank):
        time.sleep(STORE_LINGER)  # site 0 hosts the store: the others read the cause before it goes
    os._exit(code)  # a rendezvous or a process group abandoned in torch's C++ code must not hold the exit


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=CONFIG_NAME)
def _app(cfg: DictConfig):
    from .distributed import device_of, hold_folder
    from .site_symnmf import format_symnmf_site, own_similarity_columns, symnmf_site_data

    lock = run_cfg = out_dir = rank = None
    try:
        cfg = _compose(cfg)
        raw = OmegaConf.to_container(cfg, resolve=True)
        if task_of(raw).name == "fsspca":  # a worker's rows: its own section rules and run (.site_fsspca)
            from .site_fsspca import fsspca_site_main

            return fsspca_site_main(raw, SiteConfig, load_own_data, rendezvous_url)
        opts = SiteConfig.from_dict(raw.pop("site", None))
        raw.pop("distributed", None)
        name = task_of(raw).name
        if name not in SITE_TASKS:
            raise ConfigError(f"task: {name!r} has no site run in this version; site runs: {SITE_TASKS}")
        if opts.parts is not None and name != "symnmf":
            raise ConfigError("site.parts: the node sets of symmetric NMF (task=symnmf); leave it out")
        raw["data"] = symnmf_site_data(raw, opts) if name == "symnmf" else _site_data(raw.get("data") or {}, opts)
        if "centralized" in raw and "centralized" not in overridden(HydraConfig.get().overrides.task):
            raw["centralized"] = False  # a site has no baseline: it would need every site's data
        run_cfg = to_run_config(OmegaConf.create(raw))
        task = task_of(run_cfg)
        if run_cfg.trials != 1:
            raise ConfigError(f"trials: a site runs one trial, got trials={run_cfg.trials}")
        if getattr(run_cfg, "centralized", False):
            raise ConfigError("centralized: a site holds its own data only; the centralized baseline needs all of it "
                              "(centralized=false)")
        out_dir, resume = HydraConfig.get().runtime.output_dir, False
        if run_cfg.resume:
            run_cfg, out_dir, _ = resume_target(run_cfg.resume, run_cfg, HydraConfig.get().overrides.task)
            resume = True
        rank, world = opts.identity()
        own = (own_similarity_columns(run_cfg, opts, rank, world, load_own_data(opts.data)) if task.name == "symnmf"
               else _own_blocks(run_cfg, opts, rank, world))  # a wrong file: one line, before connecting
        lock = hold_folder(str(out_dir), resume)
        with Comm.connect(rendezvous_url(opts.rendezvous), rank=rank, world_size=world, backend=opts.backend,
                          device=device_of(run_cfg, 0), timeout=opts.timeout,
                          heartbeat=opts.heartbeat or None) as comm:
            summary = run_site(run_cfg, opts, own, Path(out_dir), comm, resume=resume)
    except DistributedError as exc:
        _fail(exc, EXIT_PEER_FAILED, rank)
    except PPDNMFError as exc:
        _fail(exc, EXIT_USER_ERROR)
    except KeyboardInterrupt:
        hint = f"; continue with the same command and resume={out_dir}" if out_dir is not None else ""
        print(f"ppdnmf: interrupted{hint}", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        if lock is not None:
            lock.release()
    if not run_cfg.keep_checkpoints:
        remove_checkpoints(Path(out_dir), task.checkpoint_patterns)
    text = (format_symnmf_site if task.name == "symnmf" else task.format_summary)(summary)
    print(text, flush=True)
    to_log_files(text)
    return task.objective(summary)


def main() -> None:
    """``ppdnmf site.*=...`` (routed here by :func:`ppdnmf_torch.__main__.main`)."""
    _app()
