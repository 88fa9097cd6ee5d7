"""Starting ranks: on this machine (:func:`launch_local`, ``P`` processes and a rendezvous on
``127.0.0.1``), or joining one that ``torchrun`` or SLURM started (:func:`env_world`).

:func:`launch_local` watches its processes: when one fails or dies, the others get
``grace`` seconds to notice and stop with their own error (they do, through the
transport's errors and the watchdog, :mod:`.comm`) before it terminates them; an overall
``timeout`` bounds the whole run.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import time
import traceback
from dataclasses import dataclass

__all__ = ["free_port", "RankOutcome", "launch_local", "env_world", "export_slurm_env", "max_local_ranks",
           "check_local_ranks"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (the rendezvous binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def max_local_ranks() -> int:
    """The most ranks :func:`launch_local` starts on this machine: as many as the threads
    ``threads`` may ask for (:func:`~ppdnmf_torch.threads.max_threads`, 4 per usable core)."""
    from ..threads import max_threads

    return max_threads()


def check_local_ranks(world_size, n_agents: int | None = None, *, key: str = "world_size") -> int:
    """``world_size`` local ranks, checked before any process starts: an integer >= 1, at most
    ``n_agents`` (every rank needs an agent) and at most :func:`max_local_ranks`.

    Raises
    ------
    ConfigError
        Naming ``key``.
    """
    from ..errors import ConfigError
    from ..threads import THREADS_PER_CORE

    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"{key}: must be an integer >= 1, got {world_size!r}")
    if n_agents is not None and world_size > n_agents:
        raise ConfigError(f"{key}: {world_size} ranks for {n_agents} agents; every rank needs an agent "
                          f"(at most {n_agents})")
    if world_size > max_local_ranks():
        raise ConfigError(f"{key}: {world_size} local ranks is above the limit of {THREADS_PER_CORE} per usable CPU "
                          f"core (at most {max_local_ranks()} here); start more ranks on more machines (torchrun, "
                          "SLURM)")
    return world_size


@dataclass
class RankOutcome:
    """How one rank of :func:`launch_local` ended: ``exitcode`` (negative: killed by that
    signal), its return value (``value``) or the error it raised (``error``, one line)."""

    rank: int
    exitcode: int | None
    value: object = None
    error: str | None = None


def _exit_code(exc: BaseException) -> int:
    """2 for a user error (as ``ppdnmf``), 3 for another rank's failure, 130 after Ctrl-C, else 1."""
    from ..errors import PPDNMFError
    from .comm import EXIT_PEER_FAILED, DistributedError

    if isinstance(exc, DistributedError):
        return EXIT_PEER_FAILED
    if isinstance(exc, PPDNMFError):
        return 2
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _child(rank: int, world_size: int, port: int, target, args, kwargs, queue, env: dict) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size)})
    os.environ.update(env)
    try:
        value = target(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then a non-zero exit
        text = " ".join(str(exc).split()) or type(exc).__name__
        queue.put((rank, None, f"{type(exc).__name__}: {text}", traceback.format_exc()))
        os._exit(_exit_code(exc))
    # plain pickle: tensors travel by value (a shared-memory handle would die with this process)
    queue.put((rank, pickle.dumps(value), None, None))


def launch_local(world_size: int, target, args=(), kwargs=None, *, timeout: float | None = None,
                 grace: float = 30.0, env: dict | None = None) -> list:
    """Run ``target(*args, **kwargs)`` in ``world_size`` fresh processes, ranks ``0 .. P-1`` of
    one rendezvous at ``127.0.0.1`` (``env://``: the usual variables are set; this process
    hosts the store, as torchrun's agent does), and wait.

    ``target`` must be importable (a module-level function). Returns a :class:`RankOutcome`
    per rank. A rank that fails or dies gives the others ``grace`` seconds to end on their own;
    then, and at ``timeout`` seconds, the rest are terminated (exit code ``-15``), or killed
    (``-9``) when they do not end within 5 s (a stopped process); their ``error`` says so.
    Ctrl-C (a ``KeyboardInterrupt`` here, SIGINT in the ranks) waits up to ``grace`` seconds
    for the ranks to write their checkpoints and end (exit code 130), keeping their store up,
    and returns their outcomes; a second Ctrl-C ends them and raises.
    ``world_size`` is checked against :func:`max_local_ranks` before any process starts.
    """
    check_local_ranks(world_size)
    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    # this process hosts the rendezvous store, as torchrun's agent does: a rank that fails
    # or dies takes nothing the others still need with it (its error report, the heartbeats)
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    port = store.port
    from .comm import STORE_PREFIX, LAUNCHED_ENV

    env = dict(env or {}, TORCHELASTIC_USE_AGENT_STORE="True", **{LAUNCHED_ENV: "1"})
    procs = [ctx.Process(target=_child, args=(r, world_size, port, target, tuple(args), dict(kwargs or {}), queue,
                                              env), name=f"ppdnmf-rank{r}") for r in range(world_size)]
    for p in procs:
        p.start()
    results = {}
    try:
        _watch(procs, queue, results, grace, timeout)
    except KeyboardInterrupt:
        # Ctrl-C reached the ranks too: they write their checkpoints and end (exit 130) while this
        # process keeps their store up; a second Ctrl-C ends them at once
        try:
            _watch(procs, queue, results, grace, grace)
        except KeyboardInterrupt:
            _end_ranks(procs, wait=1.0)
            raise
    for p in procs:
        p.join(10)
    while not queue.empty():
        rank, value, error, tb = queue.get()
        results[rank] = (value, error, tb)
    for r in range(world_size):  # why a rank's watchdog ended it (it printed nothing itself)
        if results.get(r, (None, None))[1] is None and procs[r].exitcode not in (None, 0):
            try:
                if store.check([f"{STORE_PREFIX}ended/{r}"]):
                    results[r] = (None, store.get(f"{STORE_PREFIX}ended/{r}").decode("utf-8", "replace"), None)
            except Exception:  # noqa: BLE001 - best effort: the exit code still tells
                pass
    del store
    out = []
    for r, p in enumerate(procs):
        value, error, _ = results.get(r, (None, None, None))
        value = pickle.loads(value) if isinstance(value, bytes) else value
        out.append(RankOutcome(r, p.exitcode, value, error))
    return out


def _watch(procs, queue, results: dict, grace: float, timeout: float | None) -> None:
    """Wait for the ranks, collecting their reports into ``results``; a rank that fails or dies
    gives the others ``grace`` seconds, the whole wait lasts at most ``timeout`` seconds; then
    the ranks still running are ended (:func:`_end_ranks`) and their ``results`` say why."""
    start, first_failure = time.monotonic(), None
    while any(p.is_alive() for p in procs):
        while not queue.empty():
            rank, value, error, tb = queue.get()
            results[rank] = (value, error, tb)
        if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
            first_failure = time.monotonic()
        now = time.monotonic()
        late = first_failure is not None and now - first_failure > grace
        if late or (timeout is not None and now - start > timeout):
            ended = _end_ranks(procs)
            why = (f"still running {grace:g} s after another rank failed" if late else
                   f"still running at the launch's timeout of {timeout:g} s")
            for r in ended:
                results.setdefault(r, (None, None, None))
                if results[r][1] is None:
                    results[r] = (None, f"{why} (stopped or hung); ended by the launcher", None)
            return
        time.sleep(0.05)


def _end_ranks(procs, wait: float = 5.0) -> list:
    """Terminate the ranks still alive (SIGTERM), and kill (SIGKILL) those that did not end
    within ``wait`` seconds: a stopped process (``kill -STOP``) never handles SIGTERM, and
    multiprocessing's exit handler would wait for it forever. Returns their ranks."""
    alive = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in alive:
        procs[r].terminate()
    deadline = time.monotonic() + wait
    for r in alive:
        procs[r].join(max(0.0, deadline - time.monotonic()))
    for r in alive:
        if procs[r].is_alive():
            procs[r].kill()
            procs[r].join(5)
    return alive


def export_slurm_env() -> bool:
    """Inside a job of several tasks that SLURM or submitit started (``srun``, or Hydra's
    submitit launcher with ``tasks_per_node`` > 1, ``submitit_local`` included): set
    ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` through
    submitit. Returns whether it did."""
    tasks = int(os.environ.get("SLURM_NTASKS") or os.environ.get("SUBMITIT_LOCAL_NTASKS") or 1)
    if "RANK" in os.environ or tasks <= 1:
        return False
    if "SUBMITIT_EXECUTOR" not in os.environ and "SLURM_PROCID" not in os.environ:
        return False
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:  # pragma: no cover - the [cluster] extra is not installed
        from ..errors import ConfigError

        raise ConfigError("distributed: a SLURM job of several tasks needs submitit to find its ranks "
                          "(pip install 'ppdnmf_torch[cluster]'), or start the ranks with torchrun") from None
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return True


def env_world():
    """``(rank, world_size, local_rank)`` of a process that ``torchrun`` (or SLURM through
    :func:`export_slurm_env`) started, or None outside one."""
    export_slurm_env()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0, "0")
    if rank >= world_size:
        from ..errors import ConfigError

        raise ConfigError(f"RANK: the environment variable is {rank}, but WORLD_SIZE = {world_size} makes the ranks "
                          f"0 .. {world_size - 1}; check the launcher's settings")
    return rank, world_size, local_rank


def _env_int(name: str, low: int, default: str | None = None) -> int:
    """The environment variable ``name`` as an integer >= ``low``, or a ``ConfigError`` naming it
    (checked up front: a bad value would otherwise surface as a rendezvous timeout)."""
    from ..errors import ConfigError

    text = os.environ.get(name, default)
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < low:
        raise ConfigError(f"{name}: the environment variable is {text!r}, not an integer >= {low} (torchrun, SLURM "
                          "or the user set it)") from None
    return value
