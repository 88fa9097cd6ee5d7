"""Data matrices (synthetic, MIT-CBCL faces, .npy, .csv) and their column split.

The data matrix ``Z (L x M)`` is split by columns over ``N`` agents,
``Z = [Z_1, ..., Z_N]``. numpy, scipy and PIL are imported inside the file
loaders only, so the numerical core stays plain torch.
"""
from __future__ import annotations

import math
import operator
import os
import random
import warnings
from dataclasses import dataclass

import torch

from ._utils import derive_seed, resolve_device, resolve_dtype
from .errors import ConfigError, DataError

__all__ = [
    "SyntheticData",
    "synthetic",
    "sparse_poisson",
    "load_cbcl",
    "load_npy",
    "load_csv",
    "load_matrix",
    "split_counts",
    "split_columns",
    "DATA_KINDS",
    "CBCL_SHAPE",
]

#: Pixels per CBCL image (19 x 19) and the image side.
CBCL_SHAPE = (19, 19)
_CBCL_PIXELS = CBCL_SHAPE[0] * CBCL_SHAPE[1]
_CBCL_HINT = (
    "get the MIT-CBCL face database #1 (training set, 2429 faces) from "
    "http://cbcl.mit.edu/software-datasets/FaceData2.html and point to it (a .mat file with "
    "variable X (361 x 2429), or a folder of 19x19 .pgm images): data.path=... on the command line, "
    "data_path=... in run_experiment, or the environment variable PPDNMF_CBCL"
)
#: where to get the CBCL faces and how to point to them (in the errors that need the file)
CBCL_HINT = _CBCL_HINT


def _as_int(value, what: str, error=ConfigError) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise error(f"{what}: expected an integer, got {value!r} ({type(value).__name__})") from None


def _device(device):
    return torch.device("cpu") if device is None else resolve_device(device)


# ----------------------------------------------------------------------------
# Synthetic data
# ----------------------------------------------------------------------------


@dataclass
class SyntheticData:
    """A synthetic data matrix and its ground-truth factors.

    Attributes
    ----------
    Z : torch.Tensor, shape (L, M)
        Data matrix ``X @ Y + noise``; may have a few slightly negative entries.
    X : torch.Tensor, shape (L, K)
        True left factor.
    Y : torch.Tensor, shape (K, M)
        True right factor.
    """

    Z: torch.Tensor
    X: torch.Tensor
    Y: torch.Tensor


def synthetic(
    L=30,
    M=200,
    K=5,
    x_mean=0.033,
    y_mean=0.8,
    noise_var=3.6e-4,
    seed=0,
    dtype=torch.float64,
    device=None,
) -> SyntheticData:
    """The paper's synthetic data: ``Z = X Y + Gamma``.

    ``X`` entries are i.i.d. exponential with mean ``x_mean``, ``Y`` entries
    i.i.d. exponential with mean ``y_mean``, and ``Gamma`` i.i.d. Gaussian with
    mean 0 and variance ``noise_var`` (about 20 dB SNR with the defaults).

    All draws are made on the CPU in float64 from one ``torch.Generator`` seeded
    with ``derive_seed(seed, "synthetic")``, in the order X, Y, noise, and only
    then cast and moved, so the same seed gives the same matrix (up to rounding
    to ``dtype``) on every device and in every dtype.

    Because of the noise, ``Z`` can have a few slightly negative entries. They
    are kept: the paper factorizes ``Z`` as is.

    Parameters
    ----------
    L, M, K : int, default 30, 200, 5
        Rows of ``Z``, columns of ``Z``, and the inner rank.
    x_mean, y_mean : float, default 0.033, 0.8
        Means of the exponential entries of ``X`` and ``Y`` (``> 0``).
    noise_var : float, default 3.6e-4
        Noise variance (``>= 0``; 0 gives an exact ``Z = X Y``).
    seed : int, default 0
    dtype : torch.dtype or str, default torch.float64
    device : torch.device or str, optional
        CPU when omitted.

    Returns
    -------
    SyntheticData
        ``Z (L, M)``, ``X (L, K)``, ``Y (K, M)``.

    Raises
    ------
    ConfigError
        If a size is not a positive integer, a mean is not positive, or the
        noise variance is negative.
    """
    L = _as_int(L, "L")
    M = _as_int(M, "M")
    K = _as_int(K, "K")
    for name, v in (("L", L), ("M", M), ("K", K)):
        if v < 1:
            raise ConfigError(f"{name}: must be >= 1, got {v}")
    for name, v in (("x_mean", x_mean), ("y_mean", y_mean)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ConfigError(f"{name}: must be a finite number > 0, got {v!r}")
    if not (isinstance(noise_var, (int, float)) and math.isfinite(noise_var) and noise_var >= 0):
        raise ConfigError(f"noise_var: must be a finite number >= 0, got {noise_var!r}")
    dtype = resolve_dtype(dtype)
    device = _device(device)
    gen = torch.Generator(device="cpu").manual_seed(derive_seed(_as_int(seed, "seed"), "synthetic"))
    f64 = torch.float64
    X = torch.empty(L, K, dtype=f64).exponential_(1.0 / float(x_mean), generator=gen)
    Y = torch.empty(K, M, dtype=f64).exponential_(1.0 / float(y_mean), generator=gen)
    noise = torch.randn(L, M, dtype=f64, generator=gen) * math.sqrt(float(noise_var))
    Z = X @ Y + noise
    return SyntheticData(
        Z=Z.to(device=device, dtype=dtype),
        X=X.to(device=device, dtype=dtype),
        Y=Y.to(device=device, dtype=dtype),
    )


def sparse_poisson(
    L=64,
    M=400,
    K=8,
    density=0.25,
    mean_count=30.0,
    seed=0,
    dtype=torch.float64,
    device=None,
) -> SyntheticData:
    """Sparse nonnegative factors seen through Poisson counts: ``Z = Poisson(c X Y) / c``.

    A structure unlike the paper's synthetic data (dense exponential factors, Gaussian
    noise): each entry of ``X (L, K)`` and ``Y (K, M)`` is nonzero with probability
    ``density`` (then exponential with mean 1), every column of ``X`` and of ``Y`` keeps
    at least one nonzero entry (a row drawn uniformly), and the noise is Poisson, so its
    variance grows with the signal, many entries of ``Z`` are exactly 0 and none is
    negative. ``c`` scales ``X Y`` to ``mean_count`` counts per entry on average
    (``E[Z] = X Y``; the relative noise of an average entry is about ``1/sqrt(mean_count)``).

    All draws are made on the CPU in float64 from one ``torch.Generator`` seeded with
    ``derive_seed(seed, "sparse_poisson")``, in the order: ``X``'s masks, values and kept
    rows, then ``Y``'s, then the counts.

    Parameters
    ----------
    L, M, K : int, default 64, 400, 8
    density : float in (0, 1], default 0.25
    mean_count : float > 0, default 30
    seed : int, default 0
    dtype : torch.dtype or str, default torch.float64
    device : torch.device or str, optional

    Returns
    -------
    SyntheticData
        ``Z (L, M)``, ``X (L, K)``, ``Y (K, M)`` with ``E[Z] = X Y``.

    Raises
    ------
    ConfigError
        If a size is not a positive integer, ``density`` is not in ``(0, 1]`` or
        ``mean_count`` is not positive.
    """
    L, M, K = (_as_int(v, name) for v, name in ((L, "L"), (M, "M"), (K, "K")))
    for name, v in (("L", L), ("M", M), ("K", K)):
        if v < 1:
            raise ConfigError(f"{name}: must be >= 1, got {v}")
    if not (isinstance(density, (int, float)) and math.isfinite(density) and 0 < density <= 1):
        raise ConfigError(f"density: must be a number in (0, 1], got {density!r}")
    if not (isinstance(mean_count, (int, float)) and math.isfinite(mean_count) and mean_count > 0):
        raise ConfigError(f"mean_count: must be a finite number > 0, got {mean_count!r}")
    dtype = resolve_dtype(dtype)
    device = _device(device)
    gen = torch.Generator(device="cpu").manual_seed(derive_seed(_as_int(seed, "seed"), "sparse_poisson"))
    f64 = torch.float64

    def sparse(rows, cols):
        mask = torch.rand(rows, cols, dtype=f64, generator=gen) < density
        values = torch.empty(rows, cols, dtype=f64).exponential_(1.0, generator=gen)
        keep = torch.randint(rows, (cols,), generator=gen)  # one nonzero per column at least
        mask[keep, torch.arange(cols)] = True
        return values * mask

    X = sparse(L, K)
    Y = sparse(K, M)
    rates = X @ Y
    c = float(mean_count) / float(rates.mean())
    Z = torch.poisson(rates * c, generator=gen) / c
    return SyntheticData(
        Z=Z.to(device=device, dtype=dtype),
        X=X.to(device=device, dtype=dtype),
        Y=Y.to(device=device, dtype=dtype),
    )


# ----------------------------------------------------------------------------
# File loaders
# ----------------------------------------------------------------------------


def _scale_to_unit(arr, source: str):
    """Scale integer images by their type's full range; floats must already be in [0, 1]."""
    import numpy as np

    if arr.dtype == np.bool_:
        return arr.astype(np.float64)
    if np.issubdtype(arr.dtype, np.integer):
        if arr.size and arr.min() < 0:
            raise DataError(f"{source}: pixel values must be >= 0, found {arr.min()}")
        return arr.astype(np.float64) / float(np.iinfo(arr.dtype).max)
    if np.issubdtype(arr.dtype, np.floating):
        a = arr.astype(np.float64)
        if not np.isfinite(a).all():
            raise DataError(f"{source}: contains NaN or infinite values")
        if a.size and (a.min() < 0 or a.max() > 1):
            # Float images outside [0, 1] carry no bit depth, so their own
            # maximum is the only scale available.
            if a.min() < 0:
                raise DataError(f"{source}: pixel values must be >= 0, found {a.min():g}")
            a = a / a.max()
        return a
    raise DataError(f"{source}: pixel values must be numeric, got dtype {arr.dtype}")


def _load_cbcl_mat(path: str):
    import numpy as np
    import scipy.io

    try:
        mat = scipy.io.loadmat(path)
    except Exception as exc:  # scipy raises several unrelated types for bad files
        raise DataError(f"path: cannot read {path!r} as a MATLAB .mat file: {exc}") from None
    if "X" not in mat:
        names = sorted(k for k in mat if not k.startswith("__"))
        raise DataError(
            f"path: {path!r} has no variable 'X' (found {names}); expected X of shape (361, M)"
        )
    arr = np.asarray(mat["X"])
    if arr.ndim != 2 or arr.shape[0] != _CBCL_PIXELS or arr.shape[1] < 1:
        raise DataError(
            f"path: variable X in {path!r} has shape {arr.shape}, expected ({_CBCL_PIXELS}, M): "
            "one 19x19 image per column"
        )
    return _scale_to_unit(arr, f"{path!r} variable X")


def _load_cbcl_pgm_dir(path: str):
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    names = sorted(f for f in os.listdir(path) if f.lower().endswith(".pgm"))
    if not names:
        raise DataError(f"path: folder {path!r} has no .pgm images; {_CBCL_HINT}")
    cols = []
    for name in names:
        fpath = os.path.join(path, name)
        try:
            with Image.open(fpath) as im:
                mode = im.mode
                img = np.asarray(im)
        except (OSError, UnidentifiedImageError) as exc:
            raise DataError(f"path: cannot read image {fpath!r}: {exc}") from None
        if img.shape != CBCL_SHAPE:
            raise DataError(f"path: image {fpath!r} has shape {img.shape}, expected 19x19 grayscale")
        # PIL rescales a PGM's maxval to the full range of its mode, so the
        # mode's range is the file's maximum value.
        if mode == "L":
            scale = 255.0
        elif mode in ("I", "I;16", "I;16B", "I;16L"):
            scale = 65535.0
        else:
            raise DataError(f"path: image {fpath!r} has mode {mode!r}, expected 8- or 16-bit grayscale")
        # Fortran order so that column.reshape(19, 19, order="F") is the upright
        # image, the convention of the .mat file.
        cols.append(img.astype(np.float64).flatten(order="F") / scale)
    return np.stack(cols, axis=1)


def load_cbcl(path, dtype=torch.float64) -> torch.Tensor:
    """Load the MIT-CBCL face training set as ``Z (361, M)`` in [0, 1].

    Column ``i`` is image ``i``: ``Z[:, i].reshape(19, 19, order="F")`` is upright.

    Parameters
    ----------
    path : str or os.PathLike
        A MATLAB ``.mat`` file holding ``X`` (uint8, 361 x M; M = 2429 for the
        training set), or a folder of 19x19 ``.pgm`` images taken in file-name
        order. 8-bit data is divided by 255 (16-bit by 65535).
    dtype : torch.dtype or str, default torch.float64

    Returns
    -------
    torch.Tensor, shape (361, M)

    Raises
    ------
    DataError
        If the path is missing (the message says where to get the data), the
        file cannot be read, lacks ``X``, or has the wrong shape, or an image
        is not 19x19 grayscale.
    """
    dtype = resolve_dtype(dtype)
    if path is None:
        raise DataError(f"path: no CBCL data path given; {_CBCL_HINT}")
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DataError(f"path: CBCL data not found at {p!r}; {_CBCL_HINT}")
    arr = _load_cbcl_pgm_dir(p) if os.path.isdir(p) else _load_cbcl_mat(p)
    return torch.from_numpy(arr).to(dtype)


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


# ----------------------------------------------------------------------------
# Column split
# ----------------------------------------------------------------------------


def split_counts(M, n_agents, lo=None, hi=None, seed=0) -> list[int]:
    """Number of columns each agent gets.

    Without bounds the split is equal: sizes differ by at most one, the larger
    ones first. With bounds (the paper's setting, e.g. 4..40 columns for the
    synthetic data and 224..245 for CBCL) each count is drawn uniformly in
    ``[lo, hi]``, and the sum is then repaired to exactly ``M`` by +/-1 moves on
    uniformly chosen agents that still have room, so the counts stay roughly
    uniform. The draw uses ``random.Random(derive_seed(seed, "split"))``.

    Parameters
    ----------
    M : int
        Total number of columns.
    n_agents : int
        Number of agents ``N``.
    lo, hi : int, optional
        Inclusive bounds on each count. If only one is given the other
        defaults to 1 (``lo``) or ``M`` (``hi``).
    seed : int, default 0

    Returns
    -------
    list of int, length N
        Positive counts summing to ``M``.

    Raises
    ------
    ConfigError
        If ``M < N``, ``N < 1``, ``lo < 1``, ``lo > hi``, ``N * lo > M`` or ``N * hi < M``.
    """
    M = _as_int(M, "M")
    n = _as_int(n_agents, "n_agents")
    if n < 1:
        raise ConfigError(f"n_agents: must be >= 1, got {n}")
    if M < n:
        raise ConfigError(f"M: {M} columns cannot give each of the {n} agents at least one column")
    if lo is None and hi is None:
        base, extra = divmod(M, n)
        return [base + 1] * extra + [base] * (n - extra)
    lo = 1 if lo is None else _as_int(lo, "lo")
    hi = M if hi is None else _as_int(hi, "hi")
    if lo < 1:
        raise ConfigError(f"lo: every agent needs at least 1 column, got lo={lo}")
    if lo > hi:
        raise ConfigError(f"lo, hi: lo={lo} is greater than hi={hi}")
    if n * lo > M:
        raise ConfigError(f"lo: {n} agents x lo={lo} = {n * lo} columns exceeds M={M}")
    if n * hi < M:
        raise ConfigError(f"hi: {n} agents x hi={hi} = {n * hi} columns is less than M={M}")
    rng = random.Random(derive_seed(_as_int(seed, "seed"), "split"))
    counts = [rng.randint(lo, hi) for _ in range(n)]
    diff = M - sum(counts)
    while diff:
        step = 1 if diff > 0 else -1
        room = [i for i, c in enumerate(counts) if (c < hi if step > 0 else c > lo)]
        counts[rng.choice(room)] += step
        diff -= step
    return counts


def split_columns(Z: torch.Tensor, counts) -> list[torch.Tensor]:
    """Split ``Z`` into contiguous column blocks ``[Z_1, ..., Z_N]``.

    Parameters
    ----------
    Z : torch.Tensor, shape (L, M)
    counts : sequence of int, length N
        Columns per agent, each ``>= 1``, summing to ``M``.

    Returns
    -------
    list of torch.Tensor, shapes (L, M_i)
        Views into ``Z`` (no copy), in agent order.

    Raises
    ------
    DataError
        If ``Z`` is not a 2-D tensor.
    ConfigError
        If a count is not a positive integer or the counts do not sum to ``M``.
    """
    if not isinstance(Z, torch.Tensor) or Z.dim() != 2:
        shape = tuple(Z.shape) if hasattr(Z, "shape") else type(Z).__name__
        raise DataError(f"Z: expected a 2-D (L, M) tensor, got {shape}")
    cs = [_as_int(c, f"counts[{i}]") for i, c in enumerate(counts)]
    if not cs:
        raise ConfigError("counts: need at least one agent")
    for i, c in enumerate(cs):
        if c < 1:
            raise ConfigError(f"counts: agent {i} gets {c} columns; every agent needs at least 1")
    if sum(cs) != Z.shape[1]:
        raise ConfigError(f"counts: sum to {sum(cs)} but Z has {Z.shape[1]} columns")
    return list(torch.split(Z, cs, dim=1))
