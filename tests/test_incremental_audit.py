"""The token adversaries of the incremental X-step (ppdnmf_torch.models.ppdnmf.audit.incremental)."""
from __future__ import annotations

import pytest
import torch

from ppdnmf_torch import graph
from ppdnmf_torch.models.ppdnmf.audit.incremental import (EXACT_REL, curious_agent_incremental, eavesdropper_incremental,
                                            record_incremental_fit)

from conftest import small_problem

G5 = graph.Graph(5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (0, 2)])
KW = dict(bcd_iters=3, x_iters=6, y_iters=5, device="cpu", seed=3, x_rho=0.5, x_gamma_spread=0.2)


def _rec(solver, g=G5, counts=(3, 4, 2, 5, 3)):
    return record_incremental_fit(small_problem(counts=counts, seed=9), g, 2, x_solver=solver, **KW)


def test_the_recording_is_one_walk_with_the_true_states():
    rec = _rec("pi_admm")
    S = rec.agents.numel()
    assert S == 3 * 6 * 5 and rec.tokens.shape == (S + 1, 8, 2) and rec.x.shape == (S + 1, 5, 8, 2)
    # the invariant along the whole walk: z = mean_i (x_i - y_i / rho)
    u = rec.x - rec.y / rec.rho
    torch.testing.assert_close(rec.tokens, u.mean(1), rtol=0, atol=1e-12)
    assert rec.agents[:5].tolist() == list(rec.order)


@pytest.mark.parametrize("solver", ["i_admm", "pi_admm", "pi_admm2"])
def test_eavesdropper(solver):
    ev = eavesdropper_incremental(_rec(solver), lsqr=False)
    assert ev["offsets_u"]["exact"] == 5  # u_i = x_i - y_i / rho of every agent, whatever the method
    if solver == "i_admm":  # recursion (11) from the public start: everything, exactly
        assert ev["recursion_x"]["max"] < EXACT_REL and ev["recursion_y"]["max"] < EXACT_REL
    else:  # the private start and step sizes break it
        assert ev["recursion_x"]["median"] > 1e-2 and ev["recursion_y"]["median"] > 1e-2
    assert ev["consensus_x"]["median"] < 1e-1


def test_lsqr_attack_runs_with_the_projection():
    ev = eavesdropper_incremental(_rec("pi_admm"))
    ls = ev["lsqr"]["converged"]
    assert ls["rows"] == ls["unknowns"] + 1 and ls["x_err"] < 1e-1


def test_curious_agent_on_a_cycle_learns_only_the_others_sum():
    cu = curious_agent_incremental(_rec("pi_admm"))
    assert cu["predecessor_u"]["exact"] == 0 and cu["exact_u_attackers"] == []


def test_the_centre_of_a_star_relays_every_token_and_sees_every_agent():
    cu = curious_agent_incremental(_rec("pi_admm", graph.star(5)))
    assert cu["exact_u_attackers"] == [0]  # the relay: one update between any two of its observations


def test_two_agents_see_each_other():
    cu = curious_agent_incremental(_rec("pi_admm", graph.complete(2), counts=(8, 9)))
    assert cu["predecessor_u"]["exact"] == 2
