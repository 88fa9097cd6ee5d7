"""An exclusive lock on a folder that one run writes into: :class:`FolderLock`.

The lock is an ``flock`` on ``<folder>/.ppdnmf.lock``, a file that names its owner (process,
host, start time, command). A second run into the same folder is refused with the owner
named; the kernel drops the lock when its holder dies, so a killed run never leaves the
folder locked. The app's run folders (:class:`~ppdnmf_torch.app.rundir.RunFolderLock`) and the
API's checkpoint folders (:func:`ppdnmf_torch.fit`'s ``checkpoint_dir``) both use it.
"""
from __future__ import annotations

import datetime
import os
import shlex
import socket
import sys

from .errors import PPDNMFError

__all__ = ["FolderLock", "LOCK_NAME"]

LOCK_NAME = ".ppdnmf.lock"

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: the lock file alone, without flock
    fcntl = None


def _owner_text() -> str:
    started = datetime.datetime.now().isoformat(timespec="seconds")
    argv = " ".join(shlex.quote(a) for a in sys.argv) if sys.argv and sys.argv[0] else "python"
    return f"pid {os.getpid()} on {socket.gethostname()}, started {started}: {argv}"


def _read(fd) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, 4096).decode(errors="replace").strip()
    except OSError:
        return ""


class FolderLock:
    """An exclusive lock on ``folder`` (:data:`LOCK_NAME` inside it), held until :meth:`release`.

    Parameters
    ----------
    folder : path
        Made when missing.
    key : str
        The parameter the folder came from, which the refusal names (``out_dir``,
        ``checkpoint_dir``).
    error : type
        The :class:`~ppdnmf_torch.errors.PPDNMFError` raised when another run holds the folder.
    """

    def __init__(self, folder, *, key: str = "out_dir", error: type = PPDNMFError):
        self.folder = os.path.abspath(os.fspath(folder))
        self.path = os.path.join(self.folder, LOCK_NAME)
        self.key, self.error = key, error
        self._fd = None

    def acquire(self) -> "FolderLock":
        os.makedirs(self.folder, exist_ok=True)
        for _ in range(10):  # the holder may remove the file between our open and our lock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    owner = _read(fd)
                    os.close(fd)
                    raise self.error(
                        f"{self.key}: {self.folder} is being written by another ppdnmf run "
                        f"({owner or 'owner unknown'}); wait for it to end, or give this run another folder"
                    ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:  # pragma: no cover - a folder whose lock file keeps changing under us
            raise self.error(f"{self.key}: cannot lock {self.folder}: its lock file keeps changing")
        os.ftruncate(fd, 0)
        os.write(fd, (_owner_text() + "\n").encode())
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: a waiting run then sees a new file
        except OSError:
            pass
        os.close(fd)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False
