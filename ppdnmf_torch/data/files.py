"""Data matrices from files (``.npy``, ``.csv``, the CBCL faces) and :func:`load_matrix` by kind.

numpy, scipy and PIL are imported inside the loaders only, so the numerical core stays
plain torch.
"""
from __future__ import annotations

import os
import warnings

import torch

from .. import budget
from .._utils import resolve_dtype
from ..errors import ConfigError, DataError
from ._args import device_or_cpu as _device
from .cbcl import load_cbcl
from .synthetic import synthetic

__all__ = ["load_npy", "load_csv", "load_matrix", "matrix_shape", "DATA_KINDS", "read_npy", "read_text", "npy_header",
           "text_shape", "check_matrix", "existing_file"]


def check_matrix(arr, source: str, key: str = "path", what: str = "(L, M) matrix"):
    """``arr`` as a finite float64 matrix with at least one row and column.

    Raises
    ------
    DataError
        Keyed ``key``, naming ``source``: not real numbers, not 2-D, empty, or an entry that is
        NaN or infinite.
    """
    import numpy as np

    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_
    ) or np.issubdtype(arr.dtype, np.complexfloating):
        raise DataError(f"{key}: {source} must hold real numbers, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise DataError(f"{key}: {source} must be a 2-D {what}, got shape {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise DataError(f"{key}: {source} matrix is empty, shape {arr.shape}")
    a = arr.astype(np.float64)
    if not np.isfinite(a).all():
        r, c = np.argwhere(~np.isfinite(a))[0]
        raise DataError(f"{key}: {source} entry ({r}, {c}) is {a[r, c]}; all entries must be finite")
    return a


def existing_file(path, what: str, key: str = "path") -> str:
    """``path`` as a string, refused (keyed ``key``) when None, a folder or missing."""
    if path is None:
        raise DataError(f"{key}: a {what} file path is required (pass data.{key}=...)")
    try:
        p = os.fspath(path)
    except TypeError:
        raise DataError(f"{key}: expected a file path, got {path!r} ({type(path).__name__})") from None
    if os.path.isdir(p):
        raise DataError(f"{key}: {p!r} is a folder; expected a {what} file")
    if not os.path.isfile(p):
        raise DataError(f"{key}: {what} file not found: {p!r}")
    return p


def npy_header(path, key: str = "path"):
    """``(shape, dtype)`` from a ``.npy`` file's header, without reading its data; the file's
    size is checked against what the header promises (a truncated file, or a header that
    claims more data than the file holds, is refused here, before anything is allocated).

    Raises
    ------
    DataError
        Keyed ``key``: not a ``.npy`` file (named for what it looks like), an unreadable
        header, pickled objects, or fewer data bytes than the header promises.
    """
    import numpy as np

    p = existing_file(path, ".npy", key)
    _check_npy_magic(p, key)
    try:
        with open(p, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(fh)
            offset = fh.tell()
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise DataError(f"{key}: {p!r} has a damaged .npy header ({_first_line(exc)})") from None
    if dtype.hasobject:
        raise DataError(f"{key}: {p!r} holds Python objects (pickled data), which are never loaded; save numbers")
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    have = os.path.getsize(p) - offset
    if have < need:
        raise DataError(f"{key}: {p!r} is truncated: its header promises {shape} {dtype} ({need} bytes of data), "
                        f"the file holds {max(have, 0)}")
    return tuple(int(n) for n in shape), dtype


def _check_fits(key: str, p: str, shape, itemsize: int) -> None:
    """Refuse a file whose numbers would not fit in memory as read and as float64, before it is read."""
    count = 1
    for n in shape:
        count *= int(n)
    budget.check_bytes(count * (itemsize + 8), key, f"{p!r} ({' x '.join(str(int(n)) for n in shape)} numbers)",
                       model="reading a data file", sizes=f"{count} numbers", hint="use a smaller file, or read it in "
                       "parts (a subset of its rows) on this machine")


def read_npy(path, key: str = "path"):
    """The array of a ``.npy`` file (any shape and dtype; never pickled objects), checked as
    :func:`npy_header` checks it before it is read.

    Raises
    ------
    DataError
        Keyed ``key``.
    """
    import numpy as np

    shape, dtype = npy_header(path, key)
    p = os.fspath(path)
    _check_fits(key, p, shape, dtype.itemsize)
    try:
        arr = np.load(p, allow_pickle=False)
    except Exception as exc:  # ValueError for pickled objects, OSError/EOFError for junk
        raise DataError(f"{key}: cannot read {p!r} as a .npy array: {_first_line(exc)}") from None
    if not isinstance(arr, np.ndarray):
        raise DataError(f"{key}: {p!r} holds a {type(arr).__name__}, expected a single .npy array")
    return arr


#: text files larger than this (bytes) are counted before they are parsed (a memory estimate)
_COUNT_ABOVE = 64 * 2**20


def read_text(path, key: str = "path", *, delimiter=",", dtype=float, what: str = "CSV"):
    """The table of a delimited text file as an array of ``dtype`` (``ndmin=2``; lines starting
    with ``#`` are comments; an empty file gives a ``(0, 0)``-like empty array).

    Raises
    ------
    DataError
        Keyed ``key``: binary bytes (not text), a field that is not of ``dtype`` (numpy's
        description, with the line), rows of different lengths.
    """
    import numpy as np

    p = existing_file(path, what, key)
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise DataError(f"{key}: cannot read {p!r}: {exc.strerror or exc}") from None
    if b"\x00" in head:
        raise DataError(f"{key}: {p!r} is not a text file (it holds binary bytes); expected a {what} file")
    if os.path.getsize(p) > _COUNT_ABOVE:  # numpy's parser holds the rows and the array: refuse one that cannot fit
        _check_fits(key, p, text_shape(p, key, delimiter), 16)
    try:
        with warnings.catch_warnings():  # "input contained no data": callers refuse the empty array
            warnings.simplefilter("ignore", UserWarning)
            return np.loadtxt(p, delimiter=delimiter, ndmin=2, dtype=dtype, comments="#", encoding="utf-8")
    except ValueError as exc:
        # numpy's message ends with advice about its own keywords (usecols=...), which this
        # loader does not take: keep the first sentence, which says what is wrong and where
        why = str(exc).split("; use `usecols`")[0].split("\n")[0]
        raise DataError(f"{key}: {p!r} is not a numeric matrix: {why}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{key}: {p!r} is not a text file (byte {exc.start} is not UTF-8); expected a {what} file") \
            from None
    except OSError as exc:
        raise DataError(f"{key}: cannot read {p!r}: {exc.strerror or exc}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().split("\n")[0]
    return text or type(exc).__name__


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
        If the file is missing or unreadable, truncated, not 2-D, empty, non-numeric, or
        has NaN/inf entries.
    """
    dtype = resolve_dtype(dtype)
    arr = read_npy(path)
    return torch.from_numpy(check_matrix(arr, repr(os.fspath(path)))).to(dtype)


#: the first bytes of every .npy file (numpy.lib.format.MAGIC_PREFIX)
_NPY_MAGIC = b"\x93NUMPY"


def _check_npy_magic(p: str, key: str = "path") -> None:
    """Refuse a file that does not start as a .npy file does (numpy would call it "pickled
    (object) data"), naming what it looks like."""
    try:
        with open(p, "rb") as fh:
            head = fh.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise DataError(f"{key}: cannot read {p!r}: {exc.strerror or exc}") from None
    if head == _NPY_MAGIC:
        return
    if head[:2] == b"PK":
        raise DataError(f"{key}: {p!r} is a .npz archive (a zip file), not a .npy array; save one array with "
                        "numpy.save")
    looks = "a text file (a CSV? use data.kind=csv)" if head and all(32 <= c < 127 or c in (9, 10, 13) for c in head) \
        else "empty" if not head else "not a .npy file"
    raise DataError(f"{key}: {p!r} does not start with the .npy magic bytes: it is {looks}")


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
        If the file is missing or not text, a field is not a number (the message gives
        numpy's description, with the line), rows differ in length, or an entry
        is NaN/inf.
    """
    import numpy as np

    dtype = resolve_dtype(dtype)
    arr = read_text(path, delimiter=delimiter, dtype=np.float64)
    return torch.from_numpy(check_matrix(arr, repr(os.fspath(path)))).to(dtype)


def text_shape(path, key: str = "path", delimiter=","):
    """``(rows, columns)`` of a delimited text file without parsing its numbers: its data lines
    (not blank, not ``#`` comments) and the fields of the first one (for a memory estimate
    before it is read)."""
    p = existing_file(path, "CSV", key)
    rows = cols = 0
    try:
        with open(p, "rb") as fh:
            for line in fh:
                text = line.split(b"#", 1)[0].strip()
                if text:
                    if not rows:
                        sep = None if delimiter is None else delimiter.encode()
                        cols = len(text.split(sep))
                    rows += 1
    except OSError as exc:
        raise DataError(f"{key}: cannot read {p!r}: {exc.strerror or exc}") from None
    return rows, cols


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


def matrix_shape(kind: str, path=None, **kw) -> tuple[int, int]:
    """``(L, M)`` of the matrix :func:`load_matrix` would load, read from the file's header (or
    counted) without loading its numbers, for a memory estimate before it is read:
    ``synthetic`` from ``L``/``M`` in ``kw`` (its defaults otherwise), ``npy`` from the header,
    ``csv`` by counting lines and the first line's fields, ``cbcl`` from the ``.mat`` file's
    table of variables or the number of ``.pgm`` images.

    Raises
    ------
    DataError
        As the loaders do, for a file that is missing or not of its kind.
    """
    k = str(kind).strip().lower()
    if k == "synthetic":
        return int(kw.get("L", 30)), int(kw.get("M", 200))
    if k == "npy":
        shape, _ = npy_header(path)
        return (int(shape[0]), int(shape[1])) if len(shape) == 2 else (0, 0)  # the loader names a bad shape
    if k == "csv":
        return text_shape(path, delimiter=kw.get("delimiter", ","))
    if k == "cbcl":
        from .cbcl import cbcl_shape

        return cbcl_shape(path)
    raise ConfigError(f"kind: unknown data kind {kind!r}; known kinds: {', '.join(DATA_KINDS)}")
