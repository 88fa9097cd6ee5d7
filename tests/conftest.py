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


# -- shared by the exchange tests (test_crypto.py, test_fast_crypto.py) ----------------
def _graphs():
    from ppdnmf_torch.graph import Graph, ring

    return Graph(3, [(0, 1), (1, 2)]), Graph(4, [(0, 1), (1, 2), (2, 3)]), ring(4)


PATH3, PATH4, CYCLE4 = _graphs()
PROTOCOLS = ["masked", "aggregated", "paper"]


def _fake_costs():
    from ppdnmf_torch.exchange.costmodel import PaillierOpCosts

    return PaillierOpCosts(key_bits=128, keygen=1e-3, encryption=1e-4, decryption=2e-4,
                           homomorphic_addition=1e-6, scalar_multiplication=1e-5)


#: made-up per-operation costs, for cost-model tests that must not calibrate
FAKE_COSTS = _fake_costs()


def drive(exchanges, topo, lk, n_iter, seed, scale=1.0, skip_step1=(), agreed=False):
    """ADMM-like iterations with monotone random penalties, the same inputs for every
    exchange; iterations in ``skip_step1`` go without the penalty round of step 1.
    ``agreed``: one draw per trial for all its edges (``penalty_schedule="agreed"``).

    Returns, per exchange, a list of ``(rho from step 1 or None, S, rho from step 5, U, g)``.
    """
    gen = torch.Generator().manual_seed(seed)
    g = torch.zeros(topo.n_directed_edges, dtype=torch.float64)
    trial_of_edge = topo.src // max(1, topo.n_agents)
    outs = [[] for _ in exchanges]
    for m in range(n_iter):
        step = torch.rand(g.shape if not agreed else (topo.n_trials,), generator=gen, dtype=torch.float64)
        g = g + (1.0 - g) * (step[trial_of_edge] if agreed else step)
        U = scale * (2 * torch.rand((topo.n_nodes, lk), generator=gen, dtype=torch.float64) - 0.5)
        for ex, out in zip(exchanges, outs):
            rho = None if m in skip_step1 else ex.penalty_sums(g, bcd_iter=1, admm_iter=m + 1)
            res = ex.exchange(U, g, bcd_iter=1, admm_iter=m + 1)
            out.append((rho, res.S, res.rho, U, g))
    return outs


def penalty_encodings(monkeypatch, topo, seed, lk):
    """Count ``IntegerCodec.encode_penalties`` calls (the returned list grows by one per
    call), and draw an exchange input ``(U (A, lk), g (2E,))``."""
    from ppdnmf_torch.exchange import IntegerCodec

    calls = []
    real = IntegerCodec.encode_penalties
    monkeypatch.setattr(IntegerCodec, "encode_penalties", lambda self, g: calls.append(g) or real(self, g))
    gen = torch.Generator().manual_seed(seed)
    U = torch.rand((topo.n_nodes, lk), generator=gen, dtype=torch.float64)
    g = 0.03 * torch.rand(topo.n_directed_edges, generator=gen, dtype=torch.float64)
    return calls, U, g
