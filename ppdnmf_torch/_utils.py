"""Small shared helpers: device/dtype resolution, seed derivation, sparse CSR matrices.

Everything that turns a user's ``"auto" | "cpu" | "cuda"`` or dtype name into a
torch object goes through this module, so the rules live in one place. The error
types live in :mod:`ppdnmf_torch.errors`.
"""
from __future__ import annotations

import hashlib
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Mapping

import numpy as np
import torch

from .errors import ConfigError

__all__ = [
    "caller_stacklevel",
    "resolve_device",
    "resolve_dtype",
    "derive_seed",
    "sparse_csr",
    "sparse_matmul",
    "plain_number",
    "counted",
    "ARRAY",
    "OPTIONS",
    "CALLBACK",
]

#: the annotations of a function's keywords that are no spec's fields, checked by type at its
#: boundary (:func:`~ppdnmf_torch.specs.check_call`; shapes and values where they are used):
#: an array (a start, a partition, a projector), a kind's options, a callback
ARRAY = torch.Tensor | np.ndarray | list | tuple | None
OPTIONS = Mapping | None
CALLBACK = Callable | None


_DEVICE_NAMES = ("auto", "cpu", "cuda")


def resolve_device(device="auto") -> torch.device:
    """Turn ``"auto" | "cpu" | "cuda" | "cuda:k"`` or a ``torch.device`` into a device.

    ``"auto"`` picks CUDA when it is available, else CPU. Asking for CUDA on a
    machine without it is an error, not a silent fallback.
    """
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        name = device.strip().lower()
        if name == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if name.split(":")[0] not in _DEVICE_NAMES[1:]:
            raise ConfigError(
                f"device: unknown device {device!r}; use one of 'auto', 'cpu', 'cuda' or 'cuda:<k>'"
            )
        dev = torch.device(name)
    else:
        raise ConfigError(f"device: expected a string or torch.device, got {type(device).__name__}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' was requested but CUDA is not available on this machine")
    return dev


_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "single": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
}


def resolve_dtype(dtype=torch.float64) -> torch.dtype:
    """Turn ``"float32" | "float64"`` (or a torch float dtype) into a torch dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.float64):
            raise ConfigError(f"dtype: {dtype} is not supported; use torch.float32 or torch.float64")
        return dtype
    if isinstance(dtype, str):
        key = dtype.strip().lower().replace("torch.", "")
        if key in _DTYPES:
            return _DTYPES[key]
    raise ConfigError(f"dtype: unknown dtype {dtype!r}; use 'float32' or 'float64'")


def derive_seed(seed: int, *labels) -> int:
    """Derive an independent 63-bit seed for one random stream from a base seed.

    Data, graph, column split and penalty draws each get their own stream, so
    changing how one of them consumes random numbers never shifts the others.
    The derivation is a hash, stable across platforms and Python versions.
    """
    text = ":".join([str(int(seed))] + [str(x) for x in labels])
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def sparse_csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """Sparse CSR ``(n, n)`` matrix from a structure that is valid by construction.

    The invariant checks are skipped (they would only cost time), and torch's one-time
    "beta" notice about sparse CSR tensors is not the caller's concern.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, col, values, size=(n, n), check_invariants=False)


def sparse_matmul(W: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``W @ B`` for a sparse CSR ``W (n, m)`` and a dense ``B (m, p)``, into ``out`` (fresh when None).

    Computed as ``out.addmm_(W, B, beta=0)``, which writes ``out`` without reading it (NaN in
    it does not propagate) and gives the bits of ``torch.mm(W, B)``. torch's ``mm`` of a
    sparse CSR matrix, with or without ``out=``, first makes a zero-filled tensor of the
    result's size for ``addmm`` (aten's ``_sparse_csr_mm_out``), whose fresh pages cost
    more than the product at large sizes (docs/PERFORMANCE.md).
    """
    if out is None:
        out = torch.empty((W.shape[0], B.shape[1]), dtype=B.dtype, device=B.device)
    return out.addmm_(W, B, beta=0)


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``"1 BCD iteration"``, ``"3 BCD iterations"``, ``"1 negative entry"``: ``n`` and the
    noun in its number (``plural`` default: ``singular + "s"``)."""
    n = int(n)
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"


def plain_number(v):
    """A counter's value as a Python ``int`` or ``float``: Python and numpy numbers and
    one-element tensors; None for anything else (booleans, strings, dicts, arrays)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 and not v.dtype == torch.bool else None
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    return None


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def caller_stacklevel() -> int:
    """The ``stacklevel`` for a :func:`warnings.warn` made in the caller of this function that
    points at the first frame outside this package (and outside scikit-learn's wrappers:
    ``set_output``, ``Pipeline``, ``GridSearchCV``): the user's line, whichever entry point
    (``fit``, the estimator, a pipeline, the CLI) it came through, so that Python's default
    filter shows the warning once per calling line."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _library_frame(frame):
        frame, level = frame.f_back, level + 1
    return level


#: frames of scikit-learn's wrappers are skipped too
_SKLEARN_PART = os.sep + "sklearn" + os.sep


def _library_frame(frame) -> bool:
    name = os.path.abspath(frame.f_code.co_filename)
    return name.startswith(_PACKAGE_DIR) or _SKLEARN_PART in name
