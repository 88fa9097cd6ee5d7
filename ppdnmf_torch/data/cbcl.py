"""The MIT-CBCL face training set: a ``.mat`` file or a folder of 19x19 ``.pgm`` images."""
from __future__ import annotations

import os

import torch

from .._utils import resolve_dtype
from ..errors import DataError

__all__ = ["load_cbcl", "cbcl_shape", "CBCL_SHAPE", "CBCL_HINT"]

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


def cbcl_shape(path) -> tuple[int, int]:
    """``(361, M)`` of the CBCL data at ``path`` without reading the images: the ``.mat``
    file's table of variables, or the number of ``.pgm`` files in a folder.

    Raises
    ------
    DataError
        As :func:`load_cbcl` does for a missing or unreadable path.
    """
    import scipy.io

    if path is None:
        raise DataError(f"path: no CBCL data path given; {_CBCL_HINT}")
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DataError(f"path: CBCL data not found at {p!r}; {_CBCL_HINT}")
    if os.path.isdir(p):
        return _CBCL_PIXELS, sum(1 for f in os.listdir(p) if f.lower().endswith(".pgm"))
    try:
        shapes = {name: shape for name, shape, _ in scipy.io.whosmat(p)}
    except Exception as exc:  # scipy raises several unrelated types for bad files
        raise DataError(f"path: cannot read {p!r} as a MATLAB .mat file: {exc}") from None
    shape = shapes.get("X", ())
    return (int(shape[0]), int(shape[1])) if len(shape) == 2 else (_CBCL_PIXELS, 0)
