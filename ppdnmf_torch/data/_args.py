"""Argument checks shared by the data modules."""
from __future__ import annotations

import operator

import torch

from .._utils import resolve_device
from ..errors import ConfigError


def as_int(value, what: str, error=ConfigError) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise error(f"{what}: expected an integer, got {value!r} ({type(value).__name__})") from None


def device_or_cpu(device):
    return torch.device("cpu") if device is None else resolve_device(device)
