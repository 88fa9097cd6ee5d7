"""The ``ppdnmf`` command (and ``python -m ppdnmf_torch``): a Hydra app over ``conf/``.

Examples::

    ppdnmf                                    # the paper's synthetic experiment
    ppdnmf experiment=paper_cbcl data.path=faces.mat   # the CBCL faces experiment
    ppdnmf solver.bcd_iters=20 exchange=quantized exchange.n_max=1e4
    ppdnmf trials=100                         # 100 seeds as one batched computation
    ppdnmf -m seed=0,1,2                      # one run folder per seed
    ppdnmf --cfg job                          # show the composed config
    ppdnmf resume=outputs/<date>/<time>       # continue an interrupted run

Hydra is used here only: the composed ``DictConfig`` names its task (``task=ppdnmf``, the
default; :mod:`ppdnmf_torch.app.tasks`), whose typed config it is converted into once
(:func:`to_run_config`; PPDNMF: :class:`~ppdnmf_torch.models.ppdnmf.config.RunConfig`), and
:func:`ppdnmf_torch.app.runner.run` does the work through the task.
A user error (a bad config value, unreadable data, an invalid graph, a codec overflow, a
folder in use, a disk that is full or read-only) is reported as one ``ppdnmf: error: ...``
line on stderr and exit code 2; the package's warnings (a degenerate result, data far
from unit scale, no convergence) as one ``ppdnmf: warning: ...`` line each. A multirun
goes on past a failed job and reports the failures at its end (exit code 2). Ctrl-C
writes a checkpoint and prints the exact command that continues the run.
"""
from __future__ import annotations

import datetime
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import sys
import threading
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ..errors import (ConfigError, ConvergenceWarning, DataScaleWarning, DegenerateResultWarning, DegreeOneWarning,
                      PPDNMFError)
from . import interrupts
from .config_dir import CONFIG_DIR
from .help import show_help, wants_help
from .progress import write_line
from .resume import RESUME_SAFE_KEYS, overridden, resume_target
from .tasks import task_of

__all__ = ["main", "to_run_config", "CONFIG_DIR", "EXIT_USER_ERROR", "EXIT_INTERRUPTED", "AppCallbacks",
           "RESUME_SAFE_KEYS", "FAILED_NAME"]


#: exit status of a run stopped by a user error
EXIT_USER_ERROR = 2
#: exit status after Ctrl-C (128 + SIGINT)
EXIT_INTERRUPTED = 130
#: bytes the writability probe of a run folder writes (Hydra's .hydra/ files take a few KiB)
PROBE_BYTES = 64 << 10
#: a failed job of a multirun leaves this file (its one-line error) in its folder
FAILED_NAME = "FAILED"
def _run_id() -> str:
    """A run folder's name: date, time to the millisecond and six random hex digits."""
    now = datetime.datetime.now()
    return f"{now:%Y-%m-%d}/{now:%H-%M-%S}.{now.microsecond // 1000:03d}-{secrets.token_hex(3)}"


# cached per config: a run (and a multirun's jobs, which get the master config's cache) sees one id
OmegaConf.register_new_resolver("ppdnmf.run_id", _run_id, use_cache=True, replace=True)


def _resolve_paths(d: dict) -> dict:
    """Relative data and graph paths (``path``, and ``labels_path`` of task=symnmf's data) are
    taken from the directory ppdnmf was started in."""
    for section in ("data", "graph"):
        node = d.get(section)
        for key in ("path", "labels_path"):
            if isinstance(node, dict) and isinstance(node.get(key), str) and node[key].strip():
                node[key] = os.path.normpath(to_absolute_path(os.path.expanduser(node[key])))
    return d


def to_run_config(cfg: DictConfig):
    """Hydra's composed config -> the validated typed config of its task (resolving
    interpolations once; PPDNMF: :class:`~ppdnmf_torch.models.ppdnmf.config.RunConfig`).

    Raises
    ------
    ConfigError
        For a missing mandatory value (``???``), an interpolation that does not resolve, an
        unknown ``task``, or a value the task's config rejects (PPDNMF:
        :func:`ppdnmf_torch.models.ppdnmf.config.from_dict`).
    """
    try:
        d = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "Missing mandatory value" in msg:
            msg = "is required (set it on the command line, e.g. " + f"{key}=...)"
        raise ConfigError(f"{key}: {msg}") from None
    return task_of(d).config_from_dict(_resolve_paths(d))


# --------------------------------------------------------------------------------------
# Your own data or graph
# --------------------------------------------------------------------------------------

#: the data kinds that are the user's own (not one of the paper's data sets)
_OWN_DATA = ("csv", "npy")


def own_inputs(cfg: DictConfig, config_name: str = "config") -> DictConfig:
    """``data=csv|npy`` or ``graph=file`` without an ``experiment=`` on the command line: the
    config composed without the default experiment preset (``paper_synthetic``, the paper's
    settings for its synthetic data), so that the user's data and graph get the library's
    defaults (``conf/solver/default.yaml``); and with ``graph=file`` and no ``n_agents=``,
    ``n_agents`` is the edge file's (its ``# n_agents: N`` header, else its largest id + 1)."""
    hc = HydraConfig.get()
    given = set(overridden(hc.overrides.task))
    choices = hc.runtime.choices
    if (choices.get("experiment") is not None and "experiment" not in given
            and (choices.get("data") in _OWN_DATA or choices.get("graph") == "file")):
        from hydra import compose

        cfg = compose(config_name=config_name, overrides=[*hc.overrides.task, "~experiment"])
    if "n_agents" not in given and OmegaConf.select(cfg, "graph.kind") == "file":
        path = OmegaConf.select(cfg, "graph.path", throw_on_missing=False)
        if isinstance(path, str) and path.strip() and path != "???":
            from ..graph.io import from_edge_list

            path = os.path.normpath(to_absolute_path(os.path.expanduser(path)))
            if os.path.isfile(path):
                try:
                    n = from_edge_list(path).n_agents
                except PPDNMFError as exc:
                    raise exc.within("graph") from None
                cfg = cfg.copy()
                with open_dict(cfg):
                    cfg.n_agents = n
    return cfg


# --------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------


#: the name of the result lines' records in ``ppdnmf.log`` (the module's name before the app had a package)
_LOG_NAME = "ppdnmf_torch.app.cli"


def _file_handlers():
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler) and h.level <= logging.INFO]


def to_log_files(text: str, run_dir: str | None = None, level: int = logging.INFO) -> None:
    """The run's result lines into the log file Hydra keeps for this call (``ppdnmf.log``)
    and, for a resumed run, into the resumed run's own ``ppdnmf.log``; the console already
    got them from ``print``."""
    handlers = _file_handlers()
    extra = None
    if run_dir is not None:
        path = os.path.abspath(os.path.join(run_dir, "ppdnmf.log"))
        if not any(os.path.abspath(h.baseFilename) == path for h in handlers):
            try:
                extra = logging.FileHandler(path, encoding="utf-8")
            except OSError:
                extra = None
            if extra is not None and handlers:
                extra.setFormatter(handlers[0].formatter)
    try:
        for handler in handlers + ([extra] if extra is not None else []):
            for line in text.splitlines():
                try:
                    handler.handle(logging.LogRecord(_LOG_NAME, level, __file__, 0, line, None, None))
                except OSError:  # a full disk must not hide the message itself
                    pass
    finally:
        if extra is not None:
            extra.close()


#: the warnings the CLI shows as one ``ppdnmf: warning: ...`` line, not attributed to a
#: library file (the CLI's reader did not write that line)
_OWN_WARNINGS = (DegenerateResultWarning, DataScaleWarning, ConvergenceWarning, DegreeOneWarning)
#: a bracketed list in a warning longer than this many items is shortened
_LIST_SHOWN = 5
#: the warning lines shown so far: each is shown once per process
SHOWN: set = set()


def _short_lists(text: str) -> str:
    """``[0, 3 (trial 1), 4 (trial 2), ...]`` of more than :data:`_LIST_SHOWN` items ->
    its first items and the count (a warning over 100 trials stays one short line)."""

    def shorten(match):
        items = [i.strip() for i in match.group(1).split(",")]
        if len(items) <= _LIST_SHOWN:
            return match.group(0)
        return f"[{', '.join(items[:_LIST_SHOWN])}, ... ({len(items)} in all)]"

    return re.sub(r"\[([^\[\]]*)\]", shorten, text)


def show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    if not issubclass(category, _OWN_WARNINGS) and category.__name__ != "InsecureKeyWarning":
        return _default(message, category, filename, lineno, file, line)
    text = _short_lists(" ".join(str(message).split()))
    if issubclass(category, DegreeOneWarning):  # the API's parameter is the CLI's graph.min_degree
        text = re.sub(r"(?<![.\w])min_degree=", "graph.min_degree=", text)
    if text in SHOWN:
        return
    SHOWN.add(text)
    write_line(f"ppdnmf: warning: {text}")  # above a progress bar, never onto its line
    to_log_files(f"warning: {text}", level=logging.WARNING)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _io_text(exc: OSError, out_dir: str | None) -> str:
    what = exc.strerror or type(exc).__name__
    filename = exc.filename or _tensorboard_file(exc, out_dir)
    where = f"cannot write {filename}" if filename else "a file operation failed"
    text = f"{where}: {what}" + (f" (errno {exc.errno})" if exc.errno else "")
    ckpt = os.path.join(out_dir, "checkpoints") if out_dir else None
    if ckpt and os.path.isdir(ckpt) and any(n.startswith("ckpt_bcd") for n in os.listdir(ckpt)):
        text += f"; the checkpoints written so far are kept in {ckpt} (free the space, then: ppdnmf resume={shlex.quote(out_dir)})"
    return text


def _tensorboard_file(exc: BaseException, out_dir: str | None) -> str | None:
    """The TensorBoard folder, when ``exc`` (whose own error names no file) came from TensorBoard's
    event writer (its thread hands its error to the next write of the run's thread)."""
    tb = exc.__traceback__
    while tb is not None:
        if f"{os.sep}tensorboard{os.sep}" in tb.tb_frame.f_code.co_filename:
            return os.path.join(out_dir, "tb") + " (TensorBoard's events file)" if out_dir else "TensorBoard's events file"
        tb = tb.tb_next
    return None


def _thread_errors(args, _default=threading.excepthook) -> None:
    """TensorBoard's writer thread re-raises a failed write (a full disk) after keeping it for the
    run's thread, whose next write raises it again: that one is reported (one line, naming the
    folder); the thread's own traceback is not printed."""
    if issubclass(args.exc_type, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
        return
    _default(args)


def _interrupted_text(exc: KeyboardInterrupt, out_dir: str | None, task=None) -> str:
    """The one line after Ctrl-C: the iteration the newest checkpoint holds and the exact command
    that continues the run, or why there is nothing to resume."""
    # only a run raises RunInterrupted, and a run has imported the driver; importing it here could
    # meet a module that this very interrupt left half imported (torch's, during the start-up)
    loop = sys.modules.get(__name__.split(".")[0] + ".driver.loop")
    if loop is not None and isinstance(exc, loop.RunInterrupted):
        if exc.checkpoint:
            return (f"interrupted after {exc.step_name} {exc.done}; checkpoint {exc.checkpoint}; continue with: "
                    f"ppdnmf resume={shlex.quote(out_dir)}")
        return (f"interrupted after {exc.step_name} {exc.done}; this run keeps no checkpoints (checkpoint_every=0, "
                "or PPDNMF's batched trials): there is nothing to resume")
    if str(exc):
        return f"interrupted: {_one_line(exc)}"
    if task is None or not out_dir:
        return "interrupted"
    ckpt = os.path.join(out_dir, "checkpoints")
    newest = None
    if os.path.isdir(ckpt):
        files = [os.path.join(r, n) for r, _, names in os.walk(ckpt) for n in names]
        newest = max(files, key=os.path.getmtime) if files else None
    try:
        done = task.resume_point(ckpt) if newest else 0
    except Exception:  # noqa: BLE001 - a checkpoint written as the interrupt came: the resume checks it
        done = 0
    if not done:
        return f"interrupted before the run's first checkpoint: there is nothing to resume; run again"
    return (f"interrupted; the newest checkpoint holds {task.step} {done} ({newest}); continue with: "
            f"ppdnmf resume={shlex.quote(out_dir)}")


def _is_multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # no Hydra config (called outside the app)
        return False


def _fail(text: str, out_dir: str | None) -> None:
    """One ``ppdnmf: error:`` line; exit 2, or in a multirun a FAILED file and on to the next job."""
    print(f"ppdnmf: error: {text}", file=sys.stderr, flush=True)
    to_log_files(f"error: {text}", level=logging.ERROR)
    if not _is_multirun():
        sys.exit(EXIT_USER_ERROR)
    if out_dir:
        try:
            with open(os.path.join(out_dir, FAILED_NAME), "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError:
            pass


def _check_writable(key: str, folder: str) -> None:
    """Before Hydra writes into ``folder``: create it and write a probe file, or stop with one
    line naming ``key`` (a read-only or full disk), exit 2."""
    probe = os.path.join(folder, ".ppdnmf_probe")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, "w", encoding="utf-8") as fh:
            # as much as Hydra's .hydra/ files take and more: a nearly full disk fails here, with one
            # line, rather than in Hydra's _save_config with a traceback
            fh.write("ppdnmf\n" * (PROBE_BYTES // 7))
            fh.flush()
            os.fsync(fh.fileno())
        os.unlink(probe)
    except OSError as exc:
        where = exc.filename if exc.filename else folder
        print(f"ppdnmf: error: {key}: cannot write {where}: {exc.strerror or type(exc).__name__}"
              + (f" (errno {exc.errno})" if exc.errno else "") + "; choose another folder or free space",
              file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)


def _refuse_unfinished(folder: str) -> None:
    """Before Hydra writes into ``folder`` (its ``.hydra/`` files and ``ppdnmf.log``): stop with one
    line and exit 2 when it holds an unfinished run of any task (:func:`~.rundir.unfinished_run`)."""
    from .rundir import refuse_unfinished_run

    try:
        refuse_unfinished_run(folder)
    except PPDNMFError as exc:
        print(f"ppdnmf: error: {_one_line(exc.renamed({'out_dir': 'hydra.run.dir'}))}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)


#: the run folders this process created (:meth:`AppCallbacks.on_run_start`), each with the
#: highest of its parents that it created too: only those are removed when their run is refused
_CREATED: dict = {}


def discard_refused(out_dir: str | None) -> bool:
    """A run refused before its first iteration (a bad value, unreadable data, an invalid
    graph): remove its folder when this process created it, so that no empty run is left for
    TensorBoard to list (nor the date folder and ``outputs/`` it made). A multirun's job keeps
    its folder, marked by its ``FAILED`` file, for the sweep's list of failures.

    Returns whether the folder was removed."""
    if not out_dir or _is_multirun() or os.path.abspath(out_dir) not in _CREATED:
        return False
    folder = os.path.abspath(out_dir)
    try:
        shutil.rmtree(folder)
    except OSError:
        return False
    top = _CREATED.pop(folder)
    while folder != top:  # the date folder and outputs/, when this run made them and left them empty
        folder = os.path.dirname(folder)
        try:
            os.rmdir(folder)
        except OSError:
            break
    return True


class AppCallbacks(Callback):
    """Hydra callbacks of the app: the run (or sweep) folder is checked to be writable before
    Hydra writes into it (one error line instead of Hydra's traceback); at the end of a
    multirun the failed jobs (their ``FAILED`` files) are listed, one line each, with exit
    code 2 when any failed."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        folder = os.path.abspath(str(config.hydra.run.dir))
        top = folder
        while not os.path.exists(os.path.dirname(top)):
            top = os.path.dirname(top)
        if not os.path.exists(folder):
            _CREATED[folder] = top
        elif not OmegaConf.select(config, "resume", default=None):
            _refuse_unfinished(folder)
        _check_writable("hydra.run.dir", folder)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _check_writable("hydra.sweep.dir", os.path.abspath(str(config.hydra.sweep.dir)))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep = str(config.hydra.sweep.dir)
        if not os.path.isdir(sweep):
            return
        jobs, failed = 0, []
        for name in sorted(os.listdir(sweep), key=lambda n: (len(n), n)):
            job = os.path.join(sweep, name)
            if os.path.isdir(os.path.join(job, ".hydra")):
                jobs += 1
                path = os.path.join(job, FAILED_NAME)
                if os.path.isfile(path):
                    with open(path, encoding="utf-8") as fh:
                        failed.append((name, fh.read().strip()))
        if failed:
            lines = [f"ppdnmf: {len(failed)} of {jobs} jobs failed:"]
            lines += [f"  job {name}: {text}" for name, text in failed]
            print("\n".join(lines), file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)


# --------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------


#: the logger of the app's own lines (the run folder at the start)
log = logging.getLogger("ppdnmf_torch.app")


def _announce(task, out_dir: str, resume_from) -> None:
    """The run folder, first: where the outputs (and, if it stops, the checkpoints) will be."""
    if resume_from is None:
        log.info("ppdnmf task=%s: run folder %s", task.name, out_dir)
        return
    try:
        done = task.resume_point(resume_from)
    except PPDNMFError:
        done = None
    at = f" from its checkpoint after {task.step} {done}" if done else ""
    log.info("ppdnmf task=%s: resuming the run in %s%s", task.name, out_dir, at)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig):
    out_dir = resume_from = task = None
    started = []  # the distributed fit's first iteration was reported: the run did start

    def mark_started(info) -> bool:
        if not started:
            started.append(True)  # any task's iteration report
        return False

    try:
        from .runner import run

        out_dir = HydraConfig.get().runtime.output_dir
        run_cfg = to_run_config(own_inputs(cfg))
        task = task_of(run_cfg)
        if run_cfg.resume:
            run_cfg, out_dir, resume_from = resume_target(run_cfg.resume, run_cfg,
                                                           HydraConfig.get().overrides.task)
            task = task_of(run_cfg)
        _announce(task, out_dir, resume_from)
        summary = run(run_cfg, out_dir, resume_from=resume_from, callback=mark_started)
    except PPDNMFError as exc:
        key = exc.key or ""
        if key == "out_dir":  # the folder: the one resumed, or the one Hydra made
            where = "resume" if resume_from is not None else (
                "hydra.sweep.dir" if _is_multirun() else "hydra.run.dir")
            exc.renamed({"out_dir": where})
        if resume_from is None and not started and discard_refused(out_dir):
            out_dir = None
        return _fail(_one_line(exc), out_dir)
    except OSError as exc:  # a full disk, a read-only folder
        return _fail(_io_text(exc, out_dir), out_dir)
    except KeyboardInterrupt as exc:  # includes the solver's RunInterrupted (checkpoint written)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second interrupt changes nothing now: one line, 130
        text = _interrupted_text(exc, out_dir, task)
        print(f"ppdnmf: {text}", file=sys.stderr, flush=True)
        to_log_files(text, level=logging.WARNING)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - a bug: in a sweep, one FAILED job and on to the next
        if not _is_multirun():
            raise
        return _fail(f"{type(exc).__name__}: {_one_line(exc)} (an unexpected error; please report it)", out_dir)
    text = task.format_summary(summary)
    print(text, flush=True)
    to_log_files(text, out_dir if resume_from is not None else None)
    # returned to Hydra's sweepers (e.g. an optimizer over solver.mu)
    return task.objective(summary)


def main() -> None:
    """Entry point of the ``ppdnmf`` console script."""
    argv = sys.argv[1:]
    if wants_help(argv):
        try:
            print(show_help([a for a in argv if not a.startswith("-")]))
            return
        except Exception:  # noqa: BLE001 - a bad override: Hydra says what is wrong, as without --help
            pass
    warnings.showwarning = show_warning
    threading.excepthook = _thread_errors
    interrupts.install()
    logging.raiseExceptions = False  # a log file on a full disk: no traceback per record
    _app()


if __name__ == "__main__":
    main()
