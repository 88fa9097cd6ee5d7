"""Issue 44 for the other models: every parameter of symmetric NMF's and FSSPCA's public functions
refuses a value of the wrong type with one error naming it (``.key``: the parameter, or
``name[i]``), never a raw ``TypeError`` and never a silent conversion; the checks are the specs'
rules (:func:`ppdnmf_torch.specs.check_call`), once per function at its boundary
(tests/test_spec.py does the same for PPDNMF's)."""
from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.graph import ring
from ppdnmf_torch.models.fsspca.deflation import fit_deflated, fit_sequential
from ppdnmf_torch.models.fsspca.experiments import run_serverless, run_task
from ppdnmf_torch.models.fsspca.fit import fit_fsspca
from ppdnmf_torch.models.fsspca.serverless import fit_serverless
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents
from ppdnmf_torch.models.symnmf.distributed import fit_symnmf_rank
from ppdnmf_torch.models.symnmf.fit import fit_symnmf
from ppdnmf_torch.models.symnmf.run import run_symnmf, run_symnmf_agents
from ppdnmf_torch.specs import check_call

#: a wrong value per parameter name (a string for a number, a float for an integer, a number for a
#: flag, a name, a mapping or a callable, a list for a mapping)
WRONG = dict(
    X="abc", rank=2.0, method=1, penalty=True, lam0="a", U0="abc", trials=2.0, seed=1.5, max_iter=2.0, tol="a",
    device=5, dtype=5, callback=5, checkpoint_dir=5, checkpoint_every=True, resume="yes", method_options=[1],
    plan=1,
    # across agents
    n_agents="3", graph="abc", parts="abc", exchange=5, exchange_options=[1], mu="0.1", g_cap="a", penalty_mode=1,
    x_iters=1.5, y_iters=True, min_degree=1.5, penalty_schedule=1, aggregation=5, aggregation_options=[1], start=1,
    start_seed=1.5,
    # over ranks
    comm="tcp://", partition=3, assignment="0101", share=1, threads="2",
    # FSSPCA
    data="abc", n_components=2.0, groups="abc", alpha="a", lambda_2="a", smoothing=1, rho=[], rho_scale="a",
    line_search=1, inner_steps=1.5, local_solver=1, center="zzz", alpha_scale=1, init=1, projector=5,
    # serverless
    consensus=1, inner_iters=1.5, center_iters="3",
    # run_task
    n_workers="3", split=1, concentration="a",
    # deflation, the app's runs
    previous="abc", sizes="abc", log_scalars=5, score=5, trial=1.5, fit=5,
)
#: the error kinds of the inputs (a ConfigError elsewhere)
KIND = {"X": pp.DataError, "data": pp.DataError, "groups": pp.DataError}


def _refused(call, name, kind=KIND):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(pp.PPDNMFError) as err:
            call()
    assert type(err.value) is kind.get(name, pp.ConfigError), (name, err.value)
    assert err.value.key == name or err.value.key.startswith((f"{name}[", f"{name}.")), (name, str(err.value))


_A = np.random.default_rng(0).random((8, 8))
SIM = (_A + _A.T) / 2
ROWS = np.random.default_rng(1).random((16, 5))
GROUPS = np.arange(16) % 2


#: a quick valid call of each function
BASE = {
    fit_symnmf: dict(X=SIM, rank=2, max_iter=1, device="cpu"),
    fit_symnmf_agents: dict(X=SIM, rank=2, n_agents=2, max_iter=1, x_iters=1, exchange="plain", device="cpu"),
    fit_serverless: dict(data=ROWS, n_components=2, graph=ring(2), groups=GROUPS, max_iter=1, inner_iters=1,
                         center_iters=1, exchange="plain"),
    fit_fsspca: dict(data=ROWS, n_components=2, groups=GROUPS, max_iter=1, aggregation="plain"),
    run_task: dict(n_workers=2, max_iter=1, aggregation="plain"),
    fit_deflated: dict(data=[ROWS[:8], ROWS[8:]], previous=np.eye(5)[:, :1], n_components=1, max_iter=1,
                       aggregation="plain"),
    fit_sequential: dict(data=[ROWS[:8], ROWS[8:]], sizes=[1, 1], max_iter=1, aggregation="plain"),
    run_serverless: dict(X=ROWS, groups=GROUPS, n_components=2, graph=ring(2), max_iter=1, center_iters=1,
                         exchange="plain"),
    run_symnmf: dict(X=SIM, rank=2, max_iter=1, device="cpu"),
    run_symnmf_agents: dict(X=SIM, rank=2, n_agents=2, max_iter=1, x_iters=1, exchange="plain", device="cpu"),
}


#: parameters named otherwise in the error: run_serverless's X is fit_serverless's ``data``
RENAMED = {(run_serverless, "X")}


def _cases(*fns):
    return [pytest.param(fn, p, id=f"{fn.__name__}-{p}") for fn in fns
            for p, v in inspect.signature(fn).parameters.items()
            if v.kind is not v.VAR_KEYWORD and (fn, p) not in RENAMED]


@pytest.mark.parametrize("fn,param", _cases(fit_symnmf, fit_symnmf_agents, fit_serverless, fit_fsspca, run_task,
                                            fit_deflated, fit_sequential, run_serverless, run_symnmf,
                                            run_symnmf_agents))
def test_every_parameter_refuses_a_wrong_type(fn, param):
    kind = dict(KIND, data=pp.ConfigError) if fn is run_task else KIND  # the task's data is a name
    _refused(lambda: fn(**dict(BASE[fn], **{param: WRONG[param]})), param, kind)


@pytest.mark.parametrize("param", list(inspect.signature(fit_symnmf_rank).parameters))
def test_fit_symnmf_rank_refuses_a_wrong_type(comm, param):
    kw = dict(comm=comm, X=SIM, rank=2, n_agents=2, max_iter=1, x_iters=1, exchange="plain")
    _refused(lambda: fit_symnmf_rank(**dict(kw, **{param: WRONG[param]})), param)


@pytest.mark.parametrize("fn,kw", [
    (fit_symnmf, dict(seed=-1)),
    (fit_symnmf_agents, dict(start_seed=-1)),
    (fit_serverless, dict(penalty_mode="zzz")),
    (fit_fsspca, dict(aggregation="zzz")),
    (run_task, dict(seed=-1)),
    (run_symnmf, dict(trial=1)),
    (fit_deflated, dict(previous=[["a"]])),
])
def test_a_value_out_of_its_rule_is_refused_by_name(fn, kw):
    """Values of the right type that the spec's rule refuses (before: a negative seed ran, an
    unknown penalty mode was named ``penalty``, an unknown aggregation ``kind``, a negative seed of
    a task's split a raw ValueError, a trial past the fit's an IndexError, loadings of strings a
    ValueError)."""
    (name,) = kw
    _refused(lambda: fn(**dict(BASE[fn], **kw)), name)


def test_check_call_takes_an_array_where_the_function_does():
    """``arrays``: a per-trial array passes to the function's own shape check; the same keyword's
    wrong scalar is still refused by the rule; a keyword in ``skip`` is not checked here."""
    from ppdnmf_torch.models.fsspca.config import SPEC, TASK

    check_call({"alpha": np.zeros(3), "rho": torch.ones(3)}, SPEC, TASK, arrays=("alpha", "rho"))
    with pytest.raises(pp.ConfigError, match=r"^alpha: must be >= 0"):
        check_call({"alpha": -1.0}, SPEC, TASK, arrays=("alpha",))
    with pytest.raises(pp.ConfigError, match=r"^alpha\[1\]: must be a number"):
        check_call({"alpha": [0.0, "a"]}, SPEC, TASK, arrays=("alpha",))
    check_call({"aggregation": object()}, SPEC, skip=("aggregation",))
    res = fit_fsspca(ROWS, 2, groups=GROUPS, alpha=np.array([0.0]), max_iter=1, tol=0.0,
                     aggregation="plain")
    assert res.z.shape == (1, 5, 2)
