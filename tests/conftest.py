"""Shared fixtures: devices, small problems, and Paillier keys made once per session."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

CBCL_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "cbcl_faces_train.mat"


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """Every device test runs on CPU, and on CUDA where there is one."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    return torch.device(request.param)


def small_problem(L=8, K=3, counts=(3, 5, 4, 6), seed=0, dtype=torch.float64):
    """Random nonnegative low-rank-plus-noise blocks ``(L, M_i)`` for solver tests."""
    gen = torch.Generator().manual_seed(seed)
    M = sum(counts)
    X = torch.rand((L, K), generator=gen, dtype=torch.float64)
    Y = torch.rand((K, M), generator=gen, dtype=torch.float64)
    Z = X @ Y + 0.01 * torch.rand((L, M), generator=gen, dtype=torch.float64)
    return list(torch.split(Z.to(dtype), list(counts), dim=1))


@pytest.fixture(scope="session")
def cbcl_path():
    if not CBCL_PATH.exists():
        pytest.skip(f"CBCL data not found at {CBCL_PATH}")
    return CBCL_PATH


@pytest.fixture(scope="session")
def paillier_keypairs():
    """``keys(bits, count)``: ``count`` distinct Paillier key pairs of ``bits`` bits, made once
    per test session and reused (small keys only: tests, never a real run)."""
    from ppdnmf_torch.exchange.paillier import generate_keypairs

    cache: dict = {}

    def keys(bits: int, count: int):
        cache[bits] = generate_keypairs(bits, count, cache.get(bits, ()))
        return list(cache[bits][:count])

    return keys
