"""Data matrices from files (``.npy``, ``.csv``, the CBCL faces) and :func:`load_matrix` by kind.

numpy, scipy and PIL are imported inside the loaders only, so the numerical core stays
plain torch.
"""
from __future__ import annotations

import os
import warnings

import torch

from .._utils import ConfigError, DataError, resolve_dtype
from ._args import device_or_cpu as _device
from .cbcl import load_cbcl
from .synthetic import synthetic

__all__ = ["load_npy", "load_csv", "load_matrix", "DATA_KINDS"]


def _check_matrix(arr, source: str):
    import numpy as np

    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_
    ) or np.issubdtype(arr.dtype, np.complexfloating):
        raise DataError(f"{source}: must hold real numbers, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise DataError(f"{source}: must be a 2-D (L, M) matrix, got shape {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise DataError(f"{source}: matrix is empty, shape {arr.shape}")
    a = arr.astype(np.float64)
    if not np.isfinite(a).all():
        r, c = np.argwhere(~np.isfinite(a))[0]
        raise DataError(f"{source}: entry ({r}, {c}) is {a[r, c]}; all entries must be finite")
    return a


def _existing_file(path, what: str) -> str:
    if path is None:
        raise DataError(f"path: a {what} file path is required (pass data.path=...)")
    p = os.fspath(path)
    if os.path.isdir(p):
        raise DataError(f"path: {p!r} is a folder; expected a {what} file")
    if not os.path.isfile(p):
        raise DataError(f"path: {what} file not found: {p!r}")
    return p


def load_npy(path, dtype=torch.float64) -> torch.Tensor:
    """Load a 2-D numeric matrix from a ``.npy`` file.

    Parameters
    ----------
    path : str or os.PathLike
    dtype : torch.dtype or str, default torch.float64

    Returns
    -------
    torch.Tensor, shape (L, M)

    Raises
    ------
    DataError
        If the file is missing or unreadable, not 2-D, empty, non-numeric, or
        has NaN/inf entries.
    """
    import numpy as np

    dtype = resolve_dtype(dtype)
    p = _existing_file(path, ".npy")
    _check_npy_magic(p)
    try:
        arr = np.load(p, allow_pickle=False)
    except Exception as exc:  # ValueError for pickled objects, OSError/EOFError for junk
        raise DataError(f"path: cannot read {p!r} as a .npy array: {exc}") from None
    if not isinstance(arr, np.ndarray):
        raise DataError(f"path: {p!r} holds a {type(arr).__name__}, expected a single .npy array")
    return torch.from_numpy(_check_matrix(arr, repr(p))).to(dtype)


#: the first bytes of every .npy file (numpy.lib.format.MAGIC_PREFIX)
_NPY_MAGIC = b"\x93NUMPY"


def _check_npy_magic(p: str) -> None:
    """Refuse a file that does not start as a .npy file does (numpy would call it "pickled
    (object) data"), naming what it looks like."""
    try:
        with open(p, "rb") as fh:
            head = fh.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise DataError(f"path: cannot read {p!r}: {exc.strerror or exc}") from None
    if head == _NPY_MAGIC:
        return
    if head[:2] == b"PK":
        raise DataError(f"path: {p!r} is a .npz archive (a zip file), not a .npy array; save one array with numpy.save")
    looks = "a text file (a CSV? use data.kind=csv)" if head and all(32 <= c < 127 or c in (9, 10, 13) for c in head) \
        else "empty" if not head else "not a .npy file"
    raise DataError(f"path: {p!r} does not start with the .npy magic bytes: it is {looks}")


def load_csv(path, dtype=torch.float64, delimiter=",") -> torch.Tensor:
    """Load a 2-D numeric matrix from a delimited text file (rows = rows of Z).

    Lines starting with ``#`` are comments.

    Parameters
    ----------
    path : str or os.PathLike
    dtype : torch.dtype or str, default torch.float64
    delimiter : str or None, default ","
        Field separator; None splits on whitespace.

    Returns
    -------
    torch.Tensor, shape (L, M)

    Raises
    ------
    DataError
        If the file is missing, a field is not a number (the message gives
        numpy's description, with the line), rows differ in length, or an entry
        is NaN/inf.
    """
    import numpy as np

    dtype = resolve_dtype(dtype)
    p = _existing_file(path, "CSV")
    try:
        with warnings.catch_warnings():  # "input contained no data": the empty matrix is refused below
            warnings.simplefilter("ignore", UserWarning)
            arr = np.loadtxt(p, delimiter=delimiter, ndmin=2, dtype=np.float64, comments="#")
    except ValueError as exc:
        # numpy's message ends with advice about its own keywords (usecols=...), which this
        # loader does not take: keep the first sentence, which says what is wrong and where
        why = str(exc).split("; use `usecols`")[0].split("\n")[0]
        raise DataError(f"path: {p!r} is not a numeric matrix: {why}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"path: cannot read {p!r}: {exc}") from None
    return torch.from_numpy(_check_matrix(arr, repr(p))).to(dtype)


DATA_KINDS = ("synthetic", "cbcl", "npy", "csv")


def load_matrix(kind: str, path=None, dtype=torch.float64, device=None, **kw) -> torch.Tensor:
    """Load a data matrix by kind.

    Parameters
    ----------
    kind : str
        ``"synthetic"`` (``**kw`` go to :func:`synthetic`; ``path`` must be None),
        ``"cbcl"``, ``"npy"`` or ``"csv"`` (``**kw`` go to the loader, e.g.
        ``delimiter``).
    path : str or os.PathLike, optional
        Data file or folder, for the file kinds.
    dtype : torch.dtype or str, default torch.float64
    device : torch.device or str, optional
        CPU when omitted.
    **kw
        Extra arguments of the loader.

    Returns
    -------
    torch.Tensor, shape (L, M)
        Only ``Z``; call :func:`synthetic` directly for the true factors.

    Raises
    ------
    ConfigError
        If ``kind`` is unknown (the message lists the known kinds) or an
        argument does not apply to the kind.
    DataError
        From the loaders.
    """
    if not isinstance(kind, str) or kind.strip().lower() not in DATA_KINDS:
        raise ConfigError(f"kind: unknown data kind {kind!r}; known kinds: {', '.join(DATA_KINDS)}")
    k = kind.strip().lower()
    dev = _device(device)
    if k == "synthetic":
        if path is not None:
            raise ConfigError("path: synthetic data takes no path")
        try:
            return synthetic(dtype=dtype, device=dev, **kw).Z
        except TypeError as exc:
            raise ConfigError(f"load_matrix: bad argument for kind 'synthetic': {exc}") from None
    allowed = {"cbcl": set(), "npy": set(), "csv": {"delimiter"}}[k]
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise ConfigError(f"load_matrix: unknown argument(s) {unknown} for kind {k!r}")
    loader = {"cbcl": load_cbcl, "npy": load_npy, "csv": load_csv}[k]
    return loader(path, dtype=dtype, **kw).to(dev)
