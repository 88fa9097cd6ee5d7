"""``python -m ppdnmf_torch.distributed``: the ``ppdnmf`` app with its agents over several ranks.

It takes the same Hydra overrides as ``ppdnmf`` and a ``distributed`` section of its own::

    python -m ppdnmf_torch.distributed distributed.nproc=2 solver.bcd_iters=20      # 2 local ranks
    torchrun --nproc-per-node 4 -m ppdnmf_torch.distributed exchange=quantized     # 4 ranks by torchrun
    python -m ppdnmf_torch.distributed -m hydra/launcher=submitit_slurm \\
        hydra.launcher.tasks_per_node=4 seed=0,1,2                                  # SLURM jobs of 4 ranks

Under ``torchrun`` (or in a SLURM job of several tasks, through submitit) every process
is a rank; otherwise this process starts ``distributed.nproc`` local ranks (gloo on
127.0.0.1) and waits for them. Rank 0 writes the outputs into Hydra's run folder and
prints the summary; the other ranks write their checkpoints only.

Exit status: 0, 2 for a user error (as ``ppdnmf``), 3 on a rank whose peer failed or died
(:data:`~.comm.EXIT_PEER_FAILED`), 130 after Ctrl-C, 143 after SIGTERM to the launcher. The
launcher hands a Ctrl-C (or ``kill -INT``) and a SIGTERM to every rank once: each writes its
checkpoint, and the launcher prints the run's one line with the ``resume=`` command. A launcher
killed outright (``kill -9``) takes its ranks with it: rank 0 prints that one line.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .resume import resume_target
from .cli import (CONFIG_DIR, EXIT_INTERRUPTED, EXIT_USER_ERROR, discard_refused, own_inputs, to_log_files,
                  to_run_config)
from .rundir import remove_checkpoints
from ..errors import ConfigError, PPDNMFError
from ..distributed.comm import BACKENDS, EXIT_PEER_FAILED, LAUNCHED_ENV, Comm, DistributedError
from ..distributed.launch import env_world, launch_local
from ..distributed.partition import PARTITION_METHODS
from .tasks import task_of

#: what may cross ranks beyond the exchange's messages (every model's rank fit takes these)
SHARE_MODES = ("all", "sums")

__all__ = ["DistConfig", "main", "rank_main", "run_rank", "CONFIG_NAME", "hold_folder", "device_of"]

#: the app's primary config: ``conf/config.yaml`` and the ``distributed`` section
CONFIG_NAME = "ppdnmf_distributed"
#: exit status of a run whose launcher got SIGTERM (128 + 15), after its ranks' checkpoints
EXIT_TERMINATED = 143


@dataclass
class DistConfig:
    """The ``distributed`` section.

    Attributes
    ----------
    nproc : int
        Local ranks to start when no launcher (torchrun, SLURM) started this process.
    partition : {"rcm", "block"}
        How agents are assigned to ranks (:func:`~.partition.partition_agents`).
    assignment : list of int, optional
        The rank of every agent (overrides ``partition``).
    backend : {"auto", "gloo", "nccl"}
    timeout : float
        Seconds any one exchange between ranks may wait.
    heartbeat : float
        Seconds without a peer's heartbeat before a rank gives up (0: no watchdog).
    share : {"all", "sums"}
        What crosses ranks beyond the exchange's messages (:func:`~.engine.fit_rank`'s
        ``share``). ``all``: every agent's factors and per-agent metric values reach rank 0
        (the single-process history, bit for bit, and the usual ``factors.pt``). ``sums``
        (a deployment, one site per rank): only per-rank sums and maxima of scalars cross;
        the history has no ``consensus`` or ``nmse_worst``, and each rank writes its own
        agents' factors to ``rank<r>/factors.pt`` in the run folder (no whole-run ``factors.pt``).
    """

    nproc: int = 1
    partition: str = "rcm"
    assignment: list | None = None
    backend: str = "auto"
    timeout: float = 300.0
    heartbeat: float = 60.0
    share: str = "all"

    def __post_init__(self):
        if not isinstance(self.nproc, int) or isinstance(self.nproc, bool) or self.nproc < 1:
            raise ConfigError(f"distributed.nproc: must be an integer >= 1, got {self.nproc!r}")
        if self.partition not in PARTITION_METHODS:
            raise ConfigError(f"distributed.partition: unknown method {self.partition!r}; use one of "
                              f"{PARTITION_METHODS}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"distributed.backend: unknown backend {self.backend!r}; use one of {BACKENDS}")
        if self.share not in SHARE_MODES:
            raise ConfigError(f"distributed.share: must be one of {SHARE_MODES}, got {self.share!r}")
        for name in ("timeout", "heartbeat"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (name == "timeout" and v == 0):
                raise ConfigError(f"distributed.{name}: must be a number {'>' if name == 'timeout' else '>='} 0, "
                                  f"got {v!r}")

    @classmethod
    def from_dict(cls, d: dict | None) -> "DistConfig":
        d = dict(d or {})
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"distributed.{unknown[0]}: unknown key; the section takes "
                              f"{sorted(cls.__dataclass_fields__)}")
        return cls(**d)


ConfigStore.instance().store(name=CONFIG_NAME, node={"defaults": ["config", "_self_"],
                                                      "distributed": asdict(DistConfig())})


# --------------------------------------------------------------------------------------
# A CLI run: one rank of it
# --------------------------------------------------------------------------------------


def run_rank(cfg, out_dir, comm: Comm, *, partition="rcm", assignment=None, resume: bool = False,
             callback=None, share: str = "all") -> dict | None:
    """One rank of ``ppdnmf`` (any task with a run over ranks) run on ``comm``'s ranks: the
    config's inputs and fit (:meth:`~.tasks.base.Task.run_rank`); ``config.yaml``, the logger
    and ``summary.json`` (with the ``distributed`` section) written by rank 0 only, into
    ``out_dir`` (rank 0's is used).

    Returns the summary on rank 0, None elsewhere. ``resume``: continue the run in ``out_dir``
    from its checkpoints (same world size and partition). ``share``: what crosses ranks beyond
    the exchange's messages (the model's rank fit's ``share``)."""
    from .loggers import NullLogger
    from .outputs import write_summary, write_yaml
    from .runner import make_logger

    task = task_of(cfg)
    t_start = time.perf_counter()
    out = Path(comm.broadcast_object(str(out_dir), 0, what="the output folder"))
    try:
        cfg.validate()
        task.n_agents(cfg)
        if comm.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            if not resume:
                (out / "summary.json").unlink(missing_ok=True)
            write_yaml(out / "config.yaml", task.config_to_dict(cfg))
        logger = (make_logger(cfg.logger.kind, out / "tb", flush_secs=cfg.logger.flush_secs) if comm.rank == 0
                  else NullLogger())
        with logger:
            summary = task.run_rank(cfg, out, comm, logger, partition=partition, assignment=assignment, share=share,
                                    resume=resume, callback=callback)
    except PPDNMFError as exc:
        raise exc.renamed(task.keys_of(cfg)) from None
    if summary is None:
        return None
    summary["wall_time"]["total"] = time.perf_counter() - t_start
    write_summary(out / "summary.json", summary)
    return summary


def device_of(cfg, local_rank: int):
    """The rank's device: ``cuda:<local rank>`` for a CUDA run, else the CPU."""
    import torch

    from .._utils import resolve_device

    dev = resolve_device(cfg.device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
    return dev


def _report_like_the_app(rank: int, out_dir: str) -> None:
    """A rank this app's launcher started has no Hydra logging: rank 0 sends the progress lines
    to stdout (where Hydra's console handler sends the one-process app's; stderr keeps the
    ``ppdnmf:`` lines) and to the run's ``ppdnmf.log``, and shows the library's warnings as the
    one-process app does (one short ``ppdnmf: warning:`` line each); the other ranks keep
    theirs to themselves, so that each warning is shown once."""
    from .cli import SHOWN, show_warning

    if rank != 0:
        warnings.showwarning = lambda *args, **kwargs: None
        return
    root = logging.getLogger("ppdnmf_torch")
    fmt = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    file = None
    try:
        file = logging.FileHandler(os.path.join(out_dir, "ppdnmf.log"), encoding="utf-8")
        file.setFormatter(fmt)
    except OSError:
        pass

    def show(message, category, filename, lineno, f=None, line=None):
        before = set(SHOWN)
        show_warning(message, category, filename, lineno, f, line)
        for text in SHOWN - before if file is not None else ():  # shown now: into the run's log too
            file.handle(logging.LogRecord("ppdnmf_torch.cli", logging.WARNING, __file__, 0, f"warning: {text}",
                                          None, None))

    warnings.showwarning = show
    if root.handlers:
        return
    stream = logging.StreamHandler(sys.stdout)
    stream.setFormatter(fmt)
    for h in (stream, file):
        if h is not None:
            root.addHandler(h)
    root.setLevel(logging.INFO)


def rank_main(cfg_dict: dict, dist: dict, out_dir: str, resume: bool, local_rank: int | None = None):
    """One rank of a run (a local rank, or a process torchrun or SLURM started): join the
    process group, run, and leave; errors are reported to the other ranks before they rise."""
    task = task_of(cfg_dict)
    cfg = task.config_from_dict(cfg_dict)
    opts = DistConfig.from_dict(dist)
    gone = None
    if os.environ.get(LAUNCHED_ENV) == "1":  # started by this app's launcher: report as the one-process app
        rank = int(os.environ.get("RANK", "0"))
        _report_like_the_app(rank, out_dir)
        gone = _follow_the_launcher(rank, out_dir, task)
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    try:
        with Comm.connect("env://", backend=opts.backend, device=device_of(cfg, local_rank), timeout=opts.timeout,
                          heartbeat=opts.heartbeat or None) as comm:
            return run_rank(cfg, out_dir, comm, partition=opts.partition, assignment=opts.assignment, resume=resume,
                            share=opts.share)
    except BaseException:
        if gone is not None:
            gone()  # the store went with the launcher: the run's one line, not this error
        raise


#: seconds between two looks of a local rank at its launcher
LAUNCHER_POLL = 0.1


def _follow_the_launcher(rank: int, out_dir: str, task) -> None:
    """A rank this app's launcher started: in a process group of its own, so that a Ctrl-C on the
    terminal reaches the launcher alone, which hands it to every rank once (:func:`_forward_signals`);
    and ended with the launcher: when the launcher is gone (``kill -9``), the rank stops at once,
    rank 0 with the run's one line (its checkpoints and the ``resume=`` command), and the errors of
    the store that went with the launcher are not printed. Returns ``gone()``, which does that
    at once when the launcher is gone (an error of the rank's own thread calls it first)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    launcher = os.getppid()
    ended = threading.Lock()

    def gone() -> None:
        """When the launcher is gone: rank 0's one line, then this rank ends (exit 3); the thread
        that comes second waits for the first to end the process."""
        if os.getppid() == launcher:
            return
        ended.acquire()
        quiet = os.open(os.devnull, os.O_WRONLY)
        if rank == 0:
            text = _interrupted_text(out_dir, task, what=f"the launcher (pid {launcher}) ended without stopping its "
                                                          "ranks (killed?); the ranks stopped")
            os.write(2, f"ppdnmf: error: {text}\n".encode())
        os.dup2(quiet, 2)  # torch's errors of the lost rendezvous store go nowhere
        os._exit(EXIT_PEER_FAILED)

    def watch():
        while os.getppid() == launcher:
            time.sleep(LAUNCHER_POLL)
        gone()

    threading.Thread(target=watch, name="ppdnmf-launcher-watch", daemon=True).start()
    return gone


class _Forwarded:
    """The launcher's SIGINT and SIGTERM while its ranks run (:func:`_forward_signals`)."""

    def __init__(self):
        self.seen = []

    def __call__(self, signum, frame):
        import multiprocessing
        import signal

        self.seen.append(signum)
        for p in multiprocessing.active_children():
            try:
                os.kill(p.pid, signal.SIGINT)  # each rank writes its checkpoint and ends (exit 130)
            except OSError:
                pass
        raise KeyboardInterrupt


def _forward_signals():
    """In the launcher: SIGINT (a Ctrl-C on the terminal, or ``kill -INT`` to the launcher alone) and
    SIGTERM go to every rank as one SIGINT (the ranks are in process groups of their own), then
    the launcher waits for their checkpoints as for a Ctrl-C. Returns the handler (its ``seen``
    signals) and the handlers it replaced."""
    import signal

    handler = _Forwarded()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        if old[s] is not signal.SIG_IGN:
            signal.signal(s, handler)
    return handler, old


def _preflight(cfg, opts: DistConfig, world) -> None:
    """What the ranks would refuse only after they started (or never): checked before any
    process is made. ``world``: :func:`~.launch.env_world` (None: this process starts the ranks)."""
    from ..distributed.comm import resolve_backend
    from ..distributed.launch import check_local_ranks
    from ..models.ppdnmf.memory import check_run

    if cfg.trials > 1:
        raise ConfigError(f"trials: a multi-process run fits one trial, got trials={cfg.trials}; run batched trials "
                          "in one process (leave the distributed.* settings out), or one multi-process run per seed "
                          "(ppdnmf -m seed=0,1,2 distributed.nproc=...)")
    n_agents = task_of(cfg).n_agents(cfg)
    if world is None:
        check_local_ranks(opts.nproc, n_agents, key="distributed.nproc")
        if task_of(cfg).name == "ppdnmf":  # the memory estimate is PPDNMF's
            check_run(cfg, nproc=opts.nproc, device=device_of(cfg, 0), dtype=cfg.dtype)
    try:
        resolve_backend(opts.backend, device_of(cfg, 0), opts.nproc if world is None else world[1])
    except PPDNMFError as exc:
        raise exc.within("distributed") from None


def hold_folder(out_dir: str, resume: bool):
    """As ``ppdnmf`` does (:mod:`ppdnmf_torch.app.rundir`): lock the run folder (the lock is returned,
    to be released when the run ends), and refuse a fresh run in a folder that holds an
    unfinished run of any task (its ranks would overwrite and prune its checkpoints)."""
    from .rundir import RunFolderLock, refuse_unfinished_run

    key = "resume" if resume else "hydra.run.dir"
    try:
        lock = RunFolderLock(out_dir).acquire()
    except PPDNMFError as exc:
        raise exc.renamed({"out_dir": key}) from None
    if not resume:
        try:
            refuse_unfinished_run(out_dir)
        except PPDNMFError as exc:
            lock.release()
            raise exc.renamed({"out_dir": key}) from None
    return lock


def _interrupted_text(out_dir, task=None, what: str = "interrupted") -> str:
    """After Ctrl-C (or SIGTERM): the outer iteration every rank's checkpoint holds
    (:meth:`~.tasks.base.Task.resume_point`), and the command that continues the run
    (:func:`ppdnmf_torch.__main__.main` routes ``resume=`` to this app)."""
    import shlex

    from .tasks import get_task

    task = get_task("ppdnmf") if task is None else task
    ckpt = os.path.join(str(out_dir), "checkpoints")
    ranks = sorted(d for d in (os.listdir(ckpt) if os.path.isdir(ckpt) else ()) if d.startswith("rank"))
    try:
        done = task.resume_point(ckpt) if ranks else 0
    except Exception:  # noqa: BLE001 - a damaged checkpoint: the resume will say which
        done = 0
    if not done:
        return f"{what} before the ranks wrote a checkpoint: there is nothing to resume; run again"
    return (f"{what} after {task.step} {done}; the {len(ranks)} ranks' checkpoints are in {ckpt}; "
            f"continue with: ppdnmf resume={shlex.quote(str(out_dir))}")


def _fail(exc: BaseException, code: int) -> None:
    text = " ".join(str(exc).split()) or type(exc).__name__
    print(f"ppdnmf: error: {text}", file=sys.stderr, flush=True)
    to_log_files(f"error: {text}", level=logging.ERROR)
    if any(t.name == "ppdnmf-rendezvous" and t.is_alive() for t in threading.enumerate()):
        # a rendezvous abandoned in torch's C++ code (:func:`.comm._rendezvous`) would hold up the
        # interpreter's exit for minutes: end now, the log files flushed
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=CONFIG_NAME)
def _app(cfg: DictConfig):
    lock = task = out_dir = None
    try:
        cfg = own_inputs(cfg, CONFIG_NAME)  # the user's data and graph get the library's defaults
        raw = OmegaConf.to_container(cfg, resolve=True)
        dist = raw.pop("distributed", None)
        opts = DistConfig.from_dict(dist)
        run_cfg = to_run_config(OmegaConf.create(raw))
        task = task_of(run_cfg)
        out_dir, resume = HydraConfig.get().runtime.output_dir, False
        if run_cfg.resume:
            run_cfg, out_dir, _ = resume_target(run_cfg.resume, run_cfg, HydraConfig.get().overrides.task)
            resume = True
        args = (task.config_to_dict(run_cfg), asdict(opts), str(out_dir), resume)
        world = env_world()
        _preflight(run_cfg, opts, world)
        if world is None or world[0] == 0:
            lock = hold_folder(str(out_dir), resume)
        if world is not None:
            summary = rank_main(*args, local_rank=world[2])
        else:
            import signal

            # the ranks' C++ warnings (a peer's lost connection, with stack frames) are not the user's lines
            os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
            forwarded, old = _forward_signals()
            try:
                outcomes = launch_local(opts.nproc, rank_main, args, grace=opts.timeout + 30)
            finally:
                for s, h in old.items():
                    signal.signal(s, h)
            bad = [o for o in outcomes if o.exitcode != 0]
            if signal.SIGTERM in forwarded.seen:
                text = _interrupted_text(out_dir, task, what="terminated (SIGTERM)")
                print(f"ppdnmf: {text}", file=sys.stderr, flush=True)
                sys.exit(EXIT_TERMINATED)
            if any(o.exitcode == EXIT_INTERRUPTED for o in bad):
                print(f"ppdnmf: {_interrupted_text(out_dir, task)}", file=sys.stderr, flush=True)
                sys.exit(EXIT_INTERRUPTED)
            if bad:
                # the rank whose own error stopped the run (not one that stopped because of it)
                first = min(bad, key=lambda o: (o.exitcode == EXIT_PEER_FAILED, o.error is None, o.rank))
                text = f"rank {first.rank}: {first.error or f'exit code {first.exitcode}'}"
                print(f"ppdnmf: error: {' '.join(text.split())}", file=sys.stderr, flush=True)
                sys.exit(first.exitcode if first.exitcode in (EXIT_USER_ERROR, EXIT_INTERRUPTED) else EXIT_PEER_FAILED)
            summary = outcomes[0].value
    except DistributedError as exc:
        _fail(exc, EXIT_PEER_FAILED)
    except PPDNMFError as exc:
        if lock is None and (task is None or not run_cfg.resume):  # refused before any rank started
            discard_refused(HydraConfig.get().runtime.output_dir)
        _fail(exc, EXIT_USER_ERROR)
    except KeyboardInterrupt as exc:
        detail = f": {' '.join(str(exc).split())}" if str(exc) else ""
        if not detail and task is not None and out_dir is not None:  # a second Ctrl-C: the ranks were ended
            print(f"ppdnmf: {_interrupted_text(out_dir, task)}", file=sys.stderr, flush=True)
        else:
            print(f"ppdnmf: interrupted{detail}", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        if lock is not None:
            lock.release()
    if summary is None:  # a rank other than 0
        return None
    if not run_cfg.keep_checkpoints:  # every rank has finished: as a one-process run, none left
        remove_checkpoints(Path(out_dir), task.checkpoint_patterns)
    text = task.format_summary(summary)
    print(text, flush=True)
    to_log_files(text)  # Hydra's ppdnmf.log of this call, as the one-process app's
    return task.objective(summary)


def main() -> None:
    """``python -m ppdnmf_torch.distributed``: ranks other than 0 of a torchrun or SLURM start
    log nothing and keep Hydra's files out of the run folder (rank 0 writes it)."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID") if int(os.environ.get("SLURM_NTASKS", "1")) > 1
                          else None)
    if rank not in (None, "0") and "-m" not in sys.argv and "--multirun" not in sys.argv:
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
        if not any(a.startswith("hydra.run.dir=") for a in sys.argv):
            sys.argv.append("hydra.run.dir=.")
    _app()
