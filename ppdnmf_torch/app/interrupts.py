"""Ctrl-C in the app: never in the middle of a file write, nor of the import of torch.

Python raises ``KeyboardInterrupt`` at the next bytecode after SIGINT, wherever that is. Inside
``torch.save`` that can be between the archive writer's creation and its end-of-file record:
the exception unwinds, the file is closed, and when the writer is collected its destructor
writes the end record to the closed file; the error cannot leave a C++ destructor, so the
process aborts (``terminate called after throwing an instance of
'pybind11::error_already_set' ... ValueError: write to closed file``, exit code 134). Landing
inside the writer's own calls it turns into a ``RuntimeError`` (``unexpected pos``) instead of
the ``KeyboardInterrupt`` the solver turns into a checkpoint.

:func:`install` replaces the SIGINT handler of the main thread by one that raises
``KeyboardInterrupt`` as Python's does, except while the main thread is inside a write
(:func:`~ppdnmf_torch.checkpoint.write_atomically`, which writes checkpoints and the run's
files, or ``torch.serialization``): then the interrupt is delivered again a moment later,
until the write has finished, so the file is whole and the solver's handler runs as usual.

The same holds while the main thread imports torch, numpy or scipy (the first seconds of a run):
an interrupt inside their initialization either aborts the process from C++ (``SIGABRT``, a
stack dump instead of one line) or leaves a module half imported, whose next import fails with
an unrelated error (numpy's ``RecursionError``). Delivered once the import is done, it is the
usual ``KeyboardInterrupt`` and its one ``ppdnmf: interrupted`` line.
"""
from __future__ import annotations

import _thread
import signal
import threading

__all__ = ["install", "in_write", "in_import", "RETRY_SECONDS"]

#: seconds between two deliveries of a deferred Ctrl-C
RETRY_SECONDS = 0.02

#: (module, function or None for any) of the frames an interrupt must not land in
_WRITES = (("ppdnmf_torch.checkpoint", "write_atomically"), ("torch.serialization", None))


def in_write(frame) -> bool:
    """Whether ``frame`` or a frame below it (its callers) is one of the writes of :data:`_WRITES`."""
    while frame is not None:
        module = frame.f_globals.get("__name__")
        for name, function in _WRITES:
            if module == name and (function is None or frame.f_code.co_name == function):
                return True
        frame = frame.f_back
    return False


#: the packages whose import an interrupt must not land in (their C extensions' initialization)
_IMPORTS = ("torch", "numpy", "scipy")


def in_import(frame) -> bool:
    """Whether ``frame`` or a frame below it runs the module code of :data:`_IMPORTS` (an import
    of one of them is in progress)."""
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            module = str(frame.f_globals.get("__name__", ""))
            if module.split(".", 1)[0] in _IMPORTS:
                return True
        frame = frame.f_back
    return False


def _deliver_later() -> None:
    timer = threading.Timer(RETRY_SECONDS, _thread.interrupt_main, args=(signal.SIGINT,))
    timer.daemon = True
    timer.start()


def _handler(signum, frame):
    if in_write(frame) or in_import(frame):
        _deliver_later()
        return
    raise KeyboardInterrupt


def install() -> None:
    """Use the deferring SIGINT handler in this process (call from the main thread). A SIGINT
    that Python ignores (``SIG_IGN``, a background job of some shells) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return
    signal.signal(signal.SIGINT, _handler)
