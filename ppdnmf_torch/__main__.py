"""``python -m ppdnmf_torch`` and the ``ppdnmf`` command: the Hydra app, in one process or over
several ranks.

A run goes to the multi-process app (:mod:`ppdnmf_torch.app.distributed`) when a launcher
started this process as one of several ranks (``torchrun --nproc-per-node 4 -m ppdnmf_torch``:
``WORLD_SIZE > 1``) or when an override names the ``distributed`` section
(``ppdnmf distributed.nproc=2``); to the site app (:mod:`ppdnmf_torch.app.site`, one party's
process holding only its own data) when an override names the ``site`` section; otherwise to the single-process app (:mod:`ppdnmf_torch.app.cli`),
unchanged. A launcher's variables that are not integers (``WORLD_SIZE=abc``) are refused with
one line (exit code 2) before anything runs.

Ctrl-C at any moment ends with one ``ppdnmf: interrupted`` line and exit code 130, during the
first seconds (the imports, Hydra's composition) too; the app's own handler takes over once the
run starts (a checkpoint and the ``resume=`` command).
"""
from __future__ import annotations

import os
import re
import signal
import sys

__all__ = ["main", "wants_ranks", "resumed_ranks", "check_launcher_env", "EXIT_USER_ERROR", "EXIT_INTERRUPTED"]

#: exit status of a run stopped by a user error, and after Ctrl-C (128 + SIGINT)
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
#: the launchers' variables that must be integers when set (torchrun, SLURM through submitit)
LAUNCHER_INTS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def check_launcher_env(environ) -> str | None:
    """The one-line error for a launcher variable that is set but not an integer >= 0, or None."""
    for name in LAUNCHER_INTS:
        text = environ.get(name)
        if text is None:
            continue
        try:
            ok = int(text.strip()) >= (1 if name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE") else 0)
        except ValueError:
            ok = False
        if not ok:
            low = 1 if name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE") else 0
            return (f"{name}: the environment variable is {text!r}, not an integer >= {low} (torchrun, SLURM or the "
                    "user set it); unset it to run in one process")
    return None


def wants_ranks(argv, environ) -> bool:
    """Whether the command line or the launcher asks for the multi-process app."""
    try:
        world = int(environ.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    return world > 1 or any(a.lstrip("+~").startswith("distributed.") for a in argv)


def resumed_ranks(argv) -> int:
    """The number of ranks of the run that ``resume=<folder>`` names (its checkpoints'
    ``rank<r>/`` folders), or 0 (none named, or a one-process run)."""
    for arg in argv:
        if arg.startswith("resume="):
            ckpt = os.path.join(os.path.expanduser(arg.split("=", 1)[1].strip("'\"")), "checkpoints")
            try:
                names = os.listdir(ckpt)
            except OSError:
                return 0
            return sum(1 for n in names if re.fullmatch(r"rank\d+", n) and os.path.isdir(os.path.join(ckpt, n)))
    return 0


def main() -> None:
    """Entry point of ``ppdnmf`` and ``python -m ppdnmf_torch``.

    A reader that closes the pipe early (``ppdnmf --help | head``) ends the output quietly, as
    for any Unix command, rather than with a ``BrokenPipeError`` traceback.

    ``resume=`` of a multi-process run goes to the multi-process app with as many local ranks as
    the run had, unless the command line says how many (``distributed.nproc=``)."""
    try:
        error = check_launcher_env(os.environ)
        if error is not None:
            print(f"ppdnmf: error: {error}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)
        if any(a.startswith("resume=") for a in sys.argv[1:]):
            from .app.resume import saved_groups  # the resumed run's task and variant, composed by Hydra

            sys.argv += saved_groups(sys.argv[1:])
        site = any(a.lstrip("+~").startswith("site.") for a in sys.argv[1:])  # one party's process
        ranks = 0 if site else resumed_ranks(sys.argv[1:])
        if ranks and not any(a.lstrip("+~").startswith("distributed.nproc=") for a in sys.argv[1:]):
            sys.argv.append(f"distributed.nproc={ranks}")
        if site:
            # torch's C++ warnings (a peer's lost connection, with stack frames) are not the user's lines
            os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
            from .app.site import main as run
        elif wants_ranks(sys.argv[1:], os.environ):
            from .app.distributed import main as run
        else:
            from .app.cli import main as run
        run()
        sys.stdout.flush()
    except BrokenPipeError:
        # Python's recipe (docs of signal, "Note on SIGPIPE"): the rest of the output goes
        # nowhere, so that the flush at exit raises nothing either
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        # before the app's own handler (the imports, Hydra's composition): nothing was written yet;
        # an interrupt that comes after this one changes nothing (the one line, exit code 130)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("ppdnmf: interrupted", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
