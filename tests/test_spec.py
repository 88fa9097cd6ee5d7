"""PPDNMF's spec (``models/ppdnmf/config.py``) is the single source of every entry point's
defaults and rules: ``fit``, ``fit_trials``, ``fit_rank``, the estimator and the CLI's solver
section agree with it (by introspection), and every parameter of every entry point refuses a
value of the wrong type with one error naming it."""
from __future__ import annotations

import dataclasses
import inspect
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import ppdnmf_torch as pp
from ppdnmf_torch.models.ppdnmf.config import (PAPER_SETTINGS, X_SOLVER_KEYS, FitOptions, SolverConfig, from_dict,
                                               to_dict)
from ppdnmf_torch.models.ppdnmf.distributed import fit_rank

ROOT = Path(__file__).resolve().parents[1]


def field_defaults(cls) -> dict:
    """``{name: default}`` of the fields of spec ``cls`` (every field has one)."""
    return {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}


#: every default of the spec (``rank`` is an argument of the entry points, the CLI's ``solver.rank``)
SPEC = {k: v for k, v in {**field_defaults(SolverConfig), **field_defaults(FitOptions)}.items() if k != "rank"}


def _keywords(fn) -> dict:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


# ---------------------------------------------------------------------------- defaults
#: what each entry point does not take from the spec, and why
NOT_TAKEN = {
    "fit_trials": {"seed": "one seed per trial (seeds)", "init_seed": "one per trial (init_seeds)",
                   "checkpoint_dir": "batched trials keep no checkpoints", "checkpoint_every": "idem",
                   "resume_from": "idem"},
    "fit_rank": {**{k: "the run over ranks has the ADMM X-step only" for k in X_SOLVER_KEYS},
                 "resume_from": "resume=True continues the newest iteration every rank has", "min_degree": "not yet"},
}
#: the entry point's own default, and why it differs from the spec's
OWN_DEFAULT = {"fit_rank": {"device": (None, "the communicator's device")}}


@pytest.mark.parametrize("name,fn,own", [
    ("fit", pp.fit, {"columns"}),
    ("fit_trials", pp.fit_trials, {"seeds", "init_seeds", "align_trials"}),
    ("fit_rank", fit_rank, {"columns", "resume", "partition", "assignment", "share"}),
])
def test_entry_points_take_every_default_from_the_spec(name, fn, own):
    kw = _keywords(fn)
    expected = {k: v for k, v in SPEC.items() if k not in NOT_TAKEN.get(name, {})}
    assert set(kw) - own == set(expected), (set(kw) - own) ^ set(expected)
    mine = OWN_DEFAULT.get(name, {})
    bad = {k: (kw[k], v) for k, v in expected.items() if not _same(kw[k], mine[k][0] if k in mine else v)}
    assert not bad, bad


def test_the_estimator_takes_its_defaults_from_the_spec():
    params = pp.PPDNMF().get_params()
    renamed = {"max_iter": "bcd_iters"}
    shared = {k: renamed.get(k, k) for k in params if renamed.get(k, k) in SPEC}
    assert len(shared) >= 20
    bad = {k: (params[k], SPEC[s]) for k, s in shared.items() if not _same(params[k], SPEC[s])}
    assert not bad, bad


def test_the_cli_solver_section_is_the_spec():
    """``conf/solver/default.yaml`` holds exactly the spec's solver keys with its defaults, and the
    config's ``solver`` section converts to the spec itself (its rules, not a copy of them)."""
    text = yaml.safe_load((ROOT / "conf" / "solver" / "default.yaml").read_text())
    spec = field_defaults(SolverConfig)
    assert set(text) == set(spec)
    assert {k: v for k, v in text.items() if v != spec[k]} == {}
    assert from_dict({"solver": text}).solver == SolverConfig(**text)
    assert to_dict(from_dict({"solver": text}))["solver"] == text


def test_paper_settings_and_the_defaults_differ_only_where_the_library_chose():
    assert {k: getattr(SolverConfig(), k) for k in PAPER_SETTINGS} == {
        "penalty_schedule": "agreed", "init": "random", "y_solver": "admm", "tol": 1e-4}
    SolverConfig(**PAPER_SETTINGS)  # the paper's settings are valid settings


# ---------------------------------------------------------------------------- types refused
Z = torch.rand(6, 16, dtype=torch.float64)
RING = pp.graph.ring(4)
QUICK = dict(bcd_iters=2, x_iters=2, y_iters=2, device="cpu")
#: one value of the wrong type per parameter (never converted: no truncation, no truthiness)
WRONG = dict(
    Z="abc", adjacency="abc", rank=2.0, columns="abc", mu="0.1", eta=[1], g_max="a", bcd_iters=2.0, x_iters="3",
    y_iters=True, tol="a", admm_tol="a", exchange=5, protocol=5, n_max="big", key_bits=1.5, g_bits="16", penalty=1,
    consensus_form=1, negative=1, seed=1.5, device=5, dtype=5, callback=5, exchange_options=[1], checkpoint_dir=5,
    checkpoint_every=True, resume_from=5, fuse="no", threads="2", penalty_schedule=1, init=1, init_seed=1.5,
    y_solver=1, x_solver=1, x_rho="a", x_gamma_spread="a", x_sigma="a", x_rounds=1.5, x_start="ab", x_walk=1,
    min_degree=1.5,
    # fit_trials
    block_lists="abc", graphs=RING, seeds=3, init_seeds=[1.5], align_trials="yes",
    # fit_rank
    comm="tcp://", resume="yes", partition=3, assignment="0101", share=1,
    # run_experiment
    name=5, trials="2", centralized="no", central_callback=5,
    # the estimator
    n_components=2.0, graph="abc", n_agents="4", random_state="abc", max_iter=2.0, transform_iters=1.5,
    transform_tol="a", verbose="loud", scale="big",
)
#: the error kinds of the inputs (a ConfigError elsewhere)
KIND = {"Z": pp.DataError, "adjacency": pp.GraphError, "graph": pp.GraphError}


def _refused(call, name, kind=KIND):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(pp.PPDNMFError) as err:
            call()
    assert type(err.value) is kind.get(name, pp.ConfigError), (name, err.value)
    assert err.value.key == name or err.value.key.startswith(f"{name}["), (name, str(err.value))


@pytest.mark.parametrize("param", list(inspect.signature(pp.fit).parameters))
def test_fit_refuses_a_wrong_type(param):
    kw = dict(Z=Z, adjacency=RING, rank=2, **QUICK)
    _refused(lambda: pp.fit(**dict(kw, **{param: WRONG[param]})), param)


@pytest.mark.parametrize("param", list(inspect.signature(pp.fit_trials).parameters))
def test_fit_trials_refuses_a_wrong_type(param):
    kw = dict(block_lists=[Z], graphs=[RING], rank=2, seeds=[0], **QUICK)
    _refused(lambda: pp.fit_trials(**dict(kw, **{param: WRONG[param]})), param)


@pytest.mark.parametrize("param", ["Z", "rank"] + [k for k in inspect.signature(pp.fit).parameters
                                                   if k not in ("Z", "adjacency", "rank", "columns")])
def test_fit_centralized_refuses_a_wrong_type(param):
    kw = dict(Z=Z, rank=2, **QUICK)
    _refused(lambda: pp.fit_centralized(**dict(kw, **{param: WRONG[param]})), param)


@pytest.mark.parametrize("param", list(inspect.signature(fit_rank).parameters))
def test_fit_rank_refuses_a_wrong_type(comm, param):
    kw = dict(comm=comm, Z=Z, adjacency=RING, rank=2, **QUICK)
    _refused(lambda: fit_rank(**dict(kw, **{param: WRONG[param]})), param)


@pytest.mark.parametrize("param", [p for p in inspect.signature(pp.run_experiment).parameters if p != "overrides"]
                         + ["mu", "bcd_iters", "n_max", "exchange_options"])
def test_run_experiment_refuses_a_wrong_type(param):
    kw = dict(name="paper_synthetic", trials=1, centralized=False, device="cpu", bcd_iters=1, x_iters=1, y_iters=1)
    _refused(lambda: pp.run_experiment(**dict(kw, **{param: WRONG[param]})), param)


@pytest.mark.parametrize("param", list(pp.PPDNMF().get_params()))
def test_the_estimator_refuses_a_wrong_type(param):
    X = np.random.default_rng(0).random((12, 6))
    kw = dict(n_components=2, max_iter=2, x_iters=2, y_iters=2, device="cpu", n_agents=3)
    # the estimator names its own parameters with a ConfigError (scikit-learn's convention), graph included
    _refused(lambda: pp.PPDNMF(**dict(kw, **{param: WRONG[param]})).fit(X), param, kind={})


# ---------------------------------------------------------------------------- issue 44's silent cases
def test_fuse_must_be_a_flag():
    with pytest.raises(pp.ConfigError, match=r"^fuse: must be true or false, got 'no'"):
        pp.fit(Z, RING, 2, fuse="no", **QUICK)


def test_an_empty_checkpoint_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for empty in ("", "  "):
        with pytest.raises(pp.ConfigError, match=r"^checkpoint_dir: is empty"):
            pp.fit(Z, RING, 2, checkpoint_dir=empty, **QUICK)
    with pytest.raises(pp.ConfigError, match=r"^resume_from: is empty"):
        pp.fit(Z, RING, 2, resume_from="", **QUICK)
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_a_negative_start_seed_is_refused():
    with pytest.raises(pp.ConfigError, match=r"^init_seed: must be an integer from 0 to 2\*\*63 - 1, got -1"):
        pp.fit(Z, RING, 2, init_seed=-1, **QUICK)


@pytest.mark.parametrize("key,value,match", [
    ("bcd_iters", 10**30, r"^bcd_iters: must be <= 2147483647"),
    ("y_iters", 10**18, r"^y_iters: must be <= 2147483647"),
    ("x_iters", 10**18, r"^x_iters: must be <= 2147483647"),
    ("bcd_iters", 2**31 - 1, r"^bcd_iters: 2147483647 BCD iterations \(a history entry each\) need about .* TiB"),
])
def test_iteration_counts_are_bounded_up_front(key, value, match):
    with pytest.raises(pp.ConfigError, match=match):
        pp.fit(Z, RING, 2, **dict(QUICK, **{key: value}))


def test_the_estimator_names_its_own_parameters():
    X = np.random.default_rng(0).random((12, 6))
    with pytest.raises(pp.ConfigError) as err:
        pp.PPDNMF(2, max_iter=2**40, device="cpu").fit(X)
    assert err.value.key == "max_iter" and str(err.value).startswith("max_iter: must be <= 2147483647")


def test_the_cli_refuses_a_y_step_that_never_ends():
    with pytest.raises(pp.ConfigError, match=r"^solver\.y_iters: must be <= 2147483647, got 1000000000000000000"):
        from_dict({"solver": {"y_iters": 1e18}})


def test_the_estimator_names_the_setting_that_takes_negative_data():
    X = np.random.default_rng(0).random((12, 6)) - 8
    with pytest.raises(pp.DataError, match=r"^X: Negative values in data passed to PPDNMF .* negative='clip' or 'shift' "
                                           r"\(or negative='allow' to factorize as is\)"):
        pp.PPDNMF(2, max_iter=2, device="cpu").fit(X)


# ---------------------------------------------------------------------------- the spec passed as it is
def test_the_cli_passes_the_solver_section_as_it_is():
    """``solver.admm_tol: null`` means what fit's ``admm_tol=None`` means (the ADMM loops at ``tol``),
    not fit's default; ``init_seed`` goes through."""
    from types import SimpleNamespace

    from ppdnmf_torch.app.tasks.ppdnmf import _solver_kwargs

    cfg = from_dict({"solver": {"admm_tol": None, "init_seed": 7}})
    kw = _solver_kwargs(cfg, SimpleNamespace(device=torch.device("cpu"), dtype=torch.float64))
    assert kw["admm_tol"] is None and kw["init_seed"] == 7
    assert set(kw) <= set(inspect.signature(pp.fit).parameters)


def test_run_experiment_trials_take_the_start_seed():
    """A trial of ``run_experiment(..., init_seed=s0)`` is the single run with that start seed (it
    was a TypeError: fit_trials takes init_seeds)."""
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial

    kw = dict(bcd_iters=2, x_iters=2, y_iters=2, init="random", init_seed=3)
    r = pp.run_experiment("paper_synthetic", trials=2, seed=4, centralized=False, device="cpu", **kw)
    blocks, g = make_trial(PAPER_EXPERIMENTS["paper_synthetic"], 5)
    one = pp.fit(blocks, g, 5, seed=5, negative="allow", device="cpu", exchange="plain", **dict(PAPER_SETTINGS, **kw))
    assert torch.equal(r.distributed.X[1], one.X)
