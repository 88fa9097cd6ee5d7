"""FSSPCA's site run in the app (:mod:`.site`): ``ppdnmf task=fsspca fsspca/variant=serverless
site.rank=1 site.world=3 site.rendezvous=host:port site.data=own.npy data.n_features=5 ...``, one
worker's process holding only its own rows (docs/DEPLOYMENT.md, "FSSPCA"); with a server
(``fsspca/variant=server``, docs/DEPLOYMENT.md, "FSSPCA with a server"): site 0 the server, started
without ``site.data``, sites ``1..n_workers`` the workers with their own rows
(:func:`~ppdnmf_torch.models.fsspca.server_site.fit_fsspca_server_site`; the server's sums through
``solver.aggregation``, ``secagg`` by default; ``site.world`` is ``n_workers + 1``). Every site
writes ``z.npy`` (the public ``z``), the history and its checkpoints; a worker's explained
variance is ``z``'s on its own rows, the server has none.

Every site runs this command with its own ``site.rank`` and ``site.data`` (its worker's rows,
``(n_i, d)``, ``.npy`` or ``.csv``) and the same public description: ``n_workers`` (one worker
per site: ``n_workers`` equals ``site.world``), ``data.n_features`` (``d``), ``n_components``,
``alpha``, the graph, the exchange, the ``solver`` and ``serverless`` settings and the seed. The
run is :func:`~ppdnmf_torch.models.fsspca.serverless_site.fit_fsspca_site`; each site writes its
own run folder: ``z.npy`` (its ``z_i``), ``components.npy``, the history (``consensus``, the same
on every site), TensorBoard scalars, ``summary.json`` (a ``site`` section; the explained
variance is its ``z_i``'s on its own rows, centred by their own mean: no site knows the pooled
data) and its checkpoints. The section's rules, the exit statuses and ``resume=`` are
:mod:`.site`'s; ``site.columns`` is PPDNMF's and refused here.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from ..distributed.comm import Comm
from ..errors import ConfigError, DataError, PPDNMFError
from .cli import to_log_files, to_run_config
from .resume import resume_target
from .rundir import remove_checkpoints

__all__ = ["fsspca_site_main", "site_options", "run_fsspca_site"]


def site_options(section: dict | None, site_config, *, server: bool = False):
    """The ``site`` section of an FSSPCA site: ``site_config``'s rules (:class:`~.site.SiteConfig`)
    without ``columns`` (a worker's rows have the public width ``data.n_features`` instead); with
    ``server`` (the variant with a server) ``data`` may be left out (``None``: site 0, the server)."""
    section = dict(section or {})
    if section.get("columns") is not None:
        raise ConfigError("site.columns: PPDNMF's column counts; an FSSPCA site's file holds its worker's rows, "
                          "of the public width data.n_features")
    none = server and section.get("data") is None
    opts = site_config.from_dict(dict(section, columns=[1], **({"data": "none"} if none else {})))
    opts.columns = None
    if none:
        opts.data = None
    return opts


def _own_rows(cfg, opts, rank: int, world: int, load):
    """This site's rows (the server: None), checked against the public description before connecting."""
    server = cfg.variant == "server"
    if server and cfg.n_workers != world - 1:
        raise ConfigError(f"n_workers: one worker per site beside the server (site 0), got n_workers={cfg.n_workers} "
                          f"for site.world={world}")
    if not server and cfg.n_workers != world:
        raise ConfigError(f"n_workers: one worker per site, got n_workers={cfg.n_workers} for site.world={world}")
    if opts.assignment is not None:
        raise ConfigError("site.assignment: an FSSPCA site holds one worker (worker i on site i, or on site i + 1 "
                          "beside the server)")
    d = cfg.data.n_features
    if d is None:
        raise ConfigError("data.n_features: give the rows' width (public, the same on every site)")
    if server and rank == 0:
        if opts.data is not None:
            raise ConfigError(f"site.data: the server (site 0) holds no rows; leave site.data out, got {opts.data!r}")
        return None
    if opts.data is None:
        raise ConfigError("site.data: give this worker site's own rows (site.data=own.npy)")
    X = load(opts.data)
    if X.dim() != 2 or X.shape[1] != d or X.shape[0] < 1:
        raise DataError(f"has shape {tuple(X.shape)}; a worker's rows are (n_i >= 1, data.n_features={d})",
                        key=f"site.data ({opts.data})")
    return X


def _fit(cfg, X, out: Path, comm: Comm, resume: bool, cb) -> tuple:
    """``(result, summary, arrays, seconds)`` of this site's fit (serverless, or with a server)."""
    import torch

    from ..models.fsspca.admm import adjusted_variance
    from ..models.fsspca.fit import prepare_problem
    from .tasks import _common as common
    from .tasks.fsspca import TASK, rank_outputs

    d = cfg.data.n_features
    dtype = getattr(torch, cfg.dtype)
    t0 = time.perf_counter()
    if cfg.variant == "server":
        from types import SimpleNamespace

        from ..models.fsspca.server_ranks import SERVER_SETTINGS
        from ..models.fsspca.server_site import fit_fsspca_server_site

        s = {k: v for k, v in {**asdict(cfg.solver), "alpha": cfg.alpha, "seed": cfg.seed}.items()
             if k in SERVER_SETTINGS}
        res = fit_fsspca_server_site(comm, None if X is None else X.to(dtype), cfg.n_components, n_features=d,
                                     n_workers=cfg.n_workers, exchange=cfg.solver.aggregation, callback=cb,
                                     checkpoint_dir=out / "checkpoints", checkpoint_every=cfg.checkpoint_every,
                                     resume=resume, dtype=dtype, **s)
        seconds = time.perf_counter() - t0
        like = SimpleNamespace(z_all=res.z[None], own={}, history=res.history, n_iter=res.n_iter,
                               converged=res.converged, bytes=float(sum(comm.sent.values())), exchange_calls=0,
                               costs={}, settings=dict(res.settings, center=cfg.solver.center))
        summary, arrays = rank_outputs(like, None, (0, d) if X is None else X.shape, cfg.n_workers)
        arrays.pop("z_workers")
        z = res.z[None]
    else:
        from ..models.fsspca.serverless_site import fit_fsspca_site

        graph = common.make_graphs(cfg.graph, cfg.n_workers, [cfg.seed])[0]
        kw = TASK.rank_kwargs(cfg, out, resume)
        res = fit_fsspca_site(comm, X.to(kw["dtype"]), cfg.n_components, graph, n_features=d, callback=cb, **kw)
        seconds = time.perf_counter() - t0
        summary, arrays = rank_outputs(res, None, X.shape, cfg.n_workers)
        z = res.own["z"][:1]
    if X is not None:  # its own rows, centred by their own mean: no site knows the pooled data
        own = prepare_problem([X.to(dtype)], 1, center=True)[0].pooled_gram()[0]
        summary["explained_variance"] = adjusted_variance(own, z).tolist()
    return res, summary, arrays, seconds


def run_fsspca_site(cfg, opts, X, out: Path, comm: Comm, *, resume: bool = False,
                    callback=None) -> dict:
    """This site's run on ``comm``: its own run folder ``out``; returns the summary. ``X``: its
    worker's rows (the server's site: None)."""
    import torch

    from .loggers import NullLogger
    from .outputs import write_summary, write_yaml
    from .progress import Progress
    from .runner import make_logger
    from .tasks import _common as common
    from .tasks.fsspca import TASK, rank_callback

    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        (out / "summary.json").unlink(missing_ok=True)
    write_yaml(out / "config.yaml", TASK.config_to_dict(cfg))
    public = {k: v for k, v in asdict(opts).items() if k not in ("data", "columns")}
    (out / "site.json").write_text(json.dumps(dict(public, rank=comm.rank, world=comm.world_size), indent=2) + "\n")
    logger = make_logger(cfg.logger.kind, out / "tb", flush_secs=cfg.logger.flush_secs) if cfg.logger.kind != "none" \
        else NullLogger()
    server = cfg.variant == "server"
    role = ("the server, " if comm.rank == 0 else "a worker, ") if server else ""
    kind = cfg.solver.aggregation if server else cfg.exchange.kind
    label = f"FSSPCA site {comm.rank} of {comm.world_size} ({role}{kind})"
    try:
        with logger:
            with Progress(cfg.progress, cfg.solver.max_iter, label, interval=cfg.progress_interval,
                          step=TASK.step) as bar:
                res, summary, arrays, seconds = _fit(cfg, X, out, comm, resume, rank_callback(logger, bar, callback))
            inputs = common.DeviceInputs(comm.device, getattr(torch, cfg.dtype),
                                         None if server else common.make_graphs(cfg.graph, cfg.n_workers, [cfg.seed]))
            summary = TASK.write_outputs(cfg, inputs, common.ModelFits(summary, arrays, seconds), out, logger)
    except PPDNMFError as exc:
        raise exc.renamed(TASK.keys_of(cfg)) from None
    if X is None:
        summary["data"] = "none (the server holds no rows)"
    summary["site"] = {"rank": comm.rank, "world": comm.world_size, "workers": res.own["workers"],
                       "rows": 0 if X is None else int(X.shape[0]), "sent": dict(comm.sent), "share": "sums",
                       "explained_variance": "none (no rows)" if X is None else
                       ("z" if server else "its z_i") + " on its own rows"}
    summary["wall_time"]["total"] = time.perf_counter() - t_start
    write_summary(out / "summary.json", summary)
    return summary


def fsspca_site_main(raw: dict, site_config, load, url) -> float:
    """The site app's run for ``task=fsspca`` (``raw``: the composed config, resolved): the section,
    the config and the rows checked (one line before connecting), the rendezvous, the run, its
    folder and summary line; returns the objective. :mod:`.site` passes its section's class, its
    data reader and its rendezvous URL (:class:`~.site.SiteConfig`, :func:`~.site.load_own_data`,
    :func:`~.site.rendezvous_url`); errors propagate to its handlers."""
    from .distributed import device_of, hold_folder
    from .tasks.fsspca import TASK

    opts = site_options(raw.pop("site", None), site_config, server=raw.get("variant") == "server")
    raw.pop("distributed", None)
    given = raw.get("data") or {}
    if opts.data is None:  # the server's site: no rows (its config's data section is the default preset's)
        raw["data"] = {"n_features": given.get("n_features")}
    elif not str(opts.data).endswith((".npy", ".csv")):
        raise ConfigError(f"site.data: an FSSPCA site reads its rows from a .npy or .csv file, got {opts.data!r}")
    else:
        raw["data"] = {"kind": "csv" if opts.data.endswith(".csv") else "npy", "path": opts.data,
                       "n_features": given.get("n_features")}
    run_cfg = to_run_config(OmegaConf.create(raw))
    if run_cfg.trials != 1:
        raise ConfigError(f"trials: a site runs one trial, got trials={run_cfg.trials}")
    out_dir, resume = HydraConfig.get().runtime.output_dir, False
    if run_cfg.resume:
        run_cfg, out_dir, _ = resume_target(run_cfg.resume, run_cfg, HydraConfig.get().overrides.task)
        resume = True
    rank, world = opts.identity()
    X = _own_rows(run_cfg, opts, rank, world, load)  # a wrong file: one line, before connecting
    lock = hold_folder(str(out_dir), resume)
    try:
        with Comm.connect(url(opts.rendezvous), rank=rank, world_size=world, backend=opts.backend,
                          device=device_of(run_cfg, 0), timeout=opts.timeout,
                          heartbeat=opts.heartbeat or None) as comm:
            summary = run_fsspca_site(run_cfg, opts, X, Path(out_dir), comm, resume=resume)
    finally:
        lock.release()
    if not run_cfg.keep_checkpoints:
        remove_checkpoints(Path(out_dir), TASK.checkpoint_patterns)
    text = TASK.format_summary(summary)
    print(text, flush=True)
    to_log_files(text)
    return TASK.objective(summary)
