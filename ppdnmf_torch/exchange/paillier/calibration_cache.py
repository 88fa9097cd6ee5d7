"""The Paillier calibration kept per machine, so that every process prices a run alike.

:func:`~.calibration.calibrate` times the operations anew in every process, and two timings of
the same settings on a shared machine differ (the CPU share of the moment is in each): two
commands that estimate the same run in two processes would print two figures. A calibration is
therefore written to one small JSON file and read back before timing, keyed by everything that
changes what an operation costs: the key size, the timed batches (``repeats``,
``exponent_bits``), the run's path settings (:func:`~.calibration.path_settings`), and the
machine (:func:`machine`: the CPU model, the core count, the versions of Python, torch, phe and
gmpy2). The file holds seconds per operation and nothing else: no key, no seed.

Where: ``$PPDNMF_CACHE/paillier_calibration.json``, else
``$XDG_CACHE_HOME/ppdnmf_torch/...``, else ``~/.cache/ppdnmf_torch/...``. ``PPDNMF_RECALIBRATE=1``
(or ``true``, ``yes``) times again and replaces the entry (after a machine's load changed for good,
or to measure the spread). A damaged or foreign file is ignored with one warning and replaced at
the next write; a file that cannot be written costs the persistence only. Writes are atomic (a
temporary file in the same folder, then :func:`os.replace`): a reader sees the old file or the
new one. Two processes that calibrate the same settings at the same moment both time them; the
later write wins.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
import warnings
from pathlib import Path

from ..costmodel import PaillierOpCosts

__all__ = ["CACHE_ENV", "RECALIBRATE_ENV", "FILE_NAME", "FORMAT", "cache_path", "machine", "entry_key", "load",
           "store", "recalibrate_requested"]

#: the folder of the cache file (default: the user's cache folder)
CACHE_ENV = "PPDNMF_CACHE"
#: set to 1, true or yes: time again and replace what the file holds
RECALIBRATE_ENV = "PPDNMF_RECALIBRATE"
FILE_NAME = "paillier_calibration.json"
#: the file's format tag and version: any other is a foreign file
FORMAT = "ppdnmf_torch paillier calibration"
VERSION = 1

_FIELDS = tuple(f.name for f in dataclasses.fields(PaillierOpCosts))
_WARNED: set = set()


def cache_path() -> Path:
    """The cache file: ``$PPDNMF_CACHE``, ``$XDG_CACHE_HOME/ppdnmf_torch`` or ``~/.cache/ppdnmf_torch``."""
    folder = os.environ.get(CACHE_ENV)
    if folder:
        return Path(folder).expanduser() / FILE_NAME
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ppdnmf_torch" / FILE_NAME


def recalibrate_requested() -> bool:
    """Whether ``$PPDNMF_RECALIBRATE`` asks to time again."""
    return os.environ.get(RECALIBRATE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(module: str) -> str:
    try:
        mod = __import__(module)
    except ImportError:
        return "none"
    v = getattr(mod, "__version__", None)
    if v is None and hasattr(mod, "version"):  # gmpy2
        v = mod.version()
    return str(v)


def machine() -> dict:
    """What an operation's cost depends on beyond the settings: the CPU model, the cores (all,
    and usable by this process), the versions of Python, torch, phe and gmpy2."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "usable_cores": usable,
            "python": platform.python_version(), "torch": _version("torch"), "phe": _version("phe"),
            "gmpy2": _version("gmpy2")}


def entry_key(key_bits: int, repeats: int, exponent_bits: int, path: dict | None) -> str:
    """The entry's key: the settings and :func:`machine`, as sorted JSON."""
    return json.dumps({"key_bits": int(key_bits), "repeats": int(repeats), "exponent_bits": int(exponent_bits),
                       "path": None if path is None else dict(sorted(path.items())), "machine": machine()},
                      sort_keys=True)


def _warn_once(file: Path, why: str) -> None:
    if str(file) not in _WARNED:
        _WARNED.add(str(file))
        warnings.warn(f"Paillier calibration cache {file}: {why}; ignored (it is rewritten at the next "
                      f"calibration; {RECALIBRATE_ENV}=1 times again)", RuntimeWarning, stacklevel=4)


def _read(file: Path) -> dict:
    """The entries of ``file``: ``{}`` when it is absent, or (with one warning) damaged or foreign."""
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        _warn_once(file, f"cannot be read ({exc.__class__.__name__})")
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        _warn_once(file, "not valid JSON (damaged)")
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION \
            or not isinstance(data.get("entries"), dict):
        _warn_once(file, f"not a {FORMAT} file of version {VERSION} (foreign)")
        return {}
    return data["entries"]


def _costs(entry) -> PaillierOpCosts | None:
    if not isinstance(entry, dict) or set(entry) != set(_FIELDS):
        return None
    if not all(isinstance(entry[k], (int, float)) and not isinstance(entry[k], bool) for k in _FIELDS):
        return None
    return PaillierOpCosts(**entry)


def load(key: str) -> PaillierOpCosts | None:
    """The calibration stored under ``key`` (:func:`entry_key`), or None."""
    file = cache_path()
    entries = _read(file)
    if key not in entries:
        return None
    costs = _costs(entries[key])
    if costs is None:
        _warn_once(file, "an entry with other fields than PaillierOpCosts' (damaged)")
    return costs


def store(key: str, costs: PaillierOpCosts) -> None:
    """Add ``costs`` under ``key`` to the cache file, atomically; a folder that cannot be
    written loses the persistence, with one warning, and nothing else."""
    file = cache_path()
    entries = _read(file)
    entries[key] = dataclasses.asdict(costs)
    data = {"format": FORMAT, "version": VERSION, "entries": entries}
    tmp = None
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".paillier_calibration.", suffix=".tmp", dir=file.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, file)
        tmp = None
    except OSError as exc:
        _warn_once(file, f"cannot be written ({exc.__class__.__name__}: {exc.strerror or exc})")
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
