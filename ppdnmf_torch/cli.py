"""The ``ppdnmf`` command (and ``python -m ppdnmf_torch``): a Hydra app over ``conf/``.

Examples::

    ppdnmf                                    # the paper's synthetic experiment
    ppdnmf experiment=paper_cbcl              # the CBCL faces experiment
    ppdnmf solver.bcd_iters=20 exchange=quantized exchange.n_max=1e4
    ppdnmf -m seed=0,1,2                      # one run folder per seed
    ppdnmf --cfg job                          # show the composed config
    ppdnmf resume=outputs/<date>/<time>       # continue an interrupted run

Hydra is used here only: the composed ``DictConfig`` is converted once into the typed
:class:`~ppdnmf_torch.config.RunConfig`, and :func:`ppdnmf_torch.runner.run` does the work.
A user error (a bad config value, unreadable data, an invalid graph, a codec overflow)
is reported as one ``ppdnmf: error: ...`` line on stderr and exit code 2.
"""
from __future__ import annotations

import logging
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ._utils import ConfigError, PPDNMFError
from .config import RunConfig, from_dict
from .runner import format_summary, run

__all__ = ["main", "to_run_config", "CONFIG_DIR", "EXIT_USER_ERROR", "EXIT_INTERRUPTED"]

def _config_dir() -> str:
    """The config folder: ``ppdnmf_torch/conf`` in an installed package (the wheel ships the
    repository's ``conf/`` there), else ``conf/`` beside the package (a source checkout or an
    editable install). An absolute path, so that the app works from any directory."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in (os.path.join(here, "conf"), os.path.join(here, os.pardir, "conf")):
        if os.path.isfile(os.path.join(folder, "config.yaml")):
            return os.path.normpath(folder)
    return os.path.normpath(os.path.join(here, "conf"))  # Hydra then says it is missing


#: the folder Hydra composes the configs from (:func:`_config_dir`)
CONFIG_DIR = _config_dir()

#: exit status of a run stopped by a user error
EXIT_USER_ERROR = 2
#: exit status after Ctrl-C (128 + SIGINT)
EXIT_INTERRUPTED = 130


def _resolve_paths(d: dict) -> dict:
    """Relative data and graph paths are taken from the directory ppdnmf was started in."""
    for section in ("data", "graph"):
        node = d.get(section)
        if isinstance(node, dict) and isinstance(node.get("path"), str) and node["path"].strip():
            node["path"] = os.path.normpath(to_absolute_path(os.path.expanduser(node["path"])))
    return d


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Hydra's composed config -> validated :class:`RunConfig` (resolving interpolations once).

    Raises
    ------
    ConfigError
        For a missing mandatory value (``???``), an interpolation that does not resolve,
        or a value :func:`ppdnmf_torch.config.from_dict` rejects.
    """
    try:
        d = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "Missing mandatory value" in msg:
            msg = "is required (set it on the command line, e.g. " + f"{key}=...)"
        raise ConfigError(f"{key}: {msg}") from None
    return from_dict(_resolve_paths(d))


def _resume_target(run_dir: str):
    """``resume=<run dir>``: that run's own config, its folder, and its checkpoints."""
    folder = os.path.normpath(to_absolute_path(os.path.expanduser(run_dir)))
    cfg_file = os.path.join(folder, "config.yaml")
    if not os.path.isfile(cfg_file):
        raise ConfigError(f"resume: {folder!r} is not a ppdnmf run folder (no config.yaml)")
    with open(cfg_file, encoding="utf-8") as fh:
        d = OmegaConf.to_container(OmegaConf.load(fh), resolve=True)
    if os.path.isfile(os.path.join(folder, "summary.json")):
        raise ConfigError(f"resume: {folder!r} holds a finished run (it has summary.json); nothing to resume, "
                          "and its outputs are left as they are")
    ckpt = os.path.join(folder, "checkpoints")
    if not os.path.isdir(ckpt):
        raise ConfigError(f"resume: {folder!r} has no checkpoints: the run stopped before writing one (during the "
                          "centralized baseline, say); start it again")
    d["resume"] = None
    return from_dict(d), folder, ckpt


def _to_log_files(text: str, run_dir: str | None = None) -> None:
    """The run's result lines into the log file Hydra keeps for this call (``ppdnmf.log``)
    and, for a resumed run, into the resumed run's own ``ppdnmf.log``; the console already
    got them from ``print``."""
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.FileHandler) and h.level <= logging.INFO]
    extra = None
    if run_dir is not None:
        path = os.path.abspath(os.path.join(run_dir, "ppdnmf.log"))
        if not any(os.path.abspath(h.baseFilename) == path for h in handlers):
            extra = logging.FileHandler(path, encoding="utf-8")
            if handlers:
                extra.setFormatter(handlers[0].formatter)
    try:
        for handler in handlers + ([extra] if extra is not None else []):
            for line in text.splitlines():
                handler.handle(logging.LogRecord(__name__, logging.INFO, __file__, 0, line, None, None))
    finally:
        if extra is not None:
            extra.close()


def _fail(exc: BaseException) -> None:
    text = " ".join(str(exc).split()) or type(exc).__name__
    print(f"ppdnmf: error: {text}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig):
    try:
        run_cfg = to_run_config(cfg)
        out_dir = HydraConfig.get().runtime.output_dir
        resume_from = None
        if run_cfg.resume:
            run_cfg, out_dir, resume_from = _resume_target(run_cfg.resume)
        summary = run(run_cfg, out_dir, resume_from=resume_from)
    except PPDNMFError as exc:
        _fail(exc)
    except KeyboardInterrupt as exc:  # includes the solver's RunInterrupted (checkpoint written)
        detail = f": {' '.join(str(exc).split())}" if str(exc) else ""
        print(f"ppdnmf: interrupted{detail}", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    text = format_summary(summary)
    print(text, flush=True)
    _to_log_files(text, out_dir if resume_from is not None else None)
    # returned to Hydra's sweepers (e.g. an optimizer over solver.mu)
    return summary["nmse"]["distributed"]


def main() -> None:
    """Entry point of the ``ppdnmf`` console script."""
    _app()


if __name__ == "__main__":
    main()
