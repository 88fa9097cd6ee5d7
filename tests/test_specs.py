"""Every model's spec is the single source of its defaults: each entry point's keyword defaults
equal its spec's (read by introspection), and a spec refuses a value of the wrong type with one
``ConfigError`` naming the key (never a conversion)."""
from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.models.fsspca import config as fcfg
from ppdnmf_torch.models.symnmf import config as scfg
from ppdnmf_torch.specs import build, defaults


def _defaults(fn) -> dict:
    sig = inspect.signature(fn)
    return {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}


def _entry_points():
    from ppdnmf_torch.models.fsspca.estimator import FederatedSparsePCA
    from ppdnmf_torch.models.fsspca.experiments import run_task
    from ppdnmf_torch.models.fsspca.fit import fit_fsspca
    from ppdnmf_torch.models.fsspca.serverless import fit_serverless
    from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents
    from ppdnmf_torch.models.symnmf.distributed import fit_symnmf_rank
    from ppdnmf_torch.models.symnmf.estimator import SymmetricNMF
    from ppdnmf_torch.models.symnmf.fit import fit_symnmf
    from ppdnmf_torch.models.symnmf.presets import run_preset

    solver = ("method", "penalty", "init", "max_iter")
    fss = list(defaults(fcfg.FSSPCASpec))
    run = list(defaults(scfg.RunSpec))
    est = ("lambda_2", "smoothing", "mu", "rho", "line_search", "inner_steps", "aggregation", "tol")
    return [
        # (entry point, {spec: the spec's fields it takes})
        (fit_symnmf, {scfg.SPEC: [f for f in defaults(scfg.SymNMFSpec) if f != "init"], scfg.RUN: run}),
        (run_preset, {scfg.SPEC: ["init"], scfg.RUN: ["trials", "seed"]}),
        (fit_symnmf_agents, {scfg.AGENTS: list(defaults(scfg.AgentsSpec)), scfg.RUN: run}),
        (fit_symnmf_rank, {scfg.AGENTS: list(defaults(scfg.AgentsSpec)), scfg.RANKS: list(defaults(scfg.RankSpec)),
                           scfg.RUN: ["seed", "checkpoint_every"]}),
        (SymmetricNMF.__init__, {scfg.CLUSTERING: list(defaults(scfg.ClusteringSpec)), scfg.SPEC: list(solver)}),
        (fit_fsspca, {fcfg.SPEC: fss, fcfg.TASK: ["alpha"], fcfg.RUN: run}),
        (fit_serverless, {fcfg.SPEC: [f for f in fss if f != "aggregation"], fcfg.TASK: ["alpha"],
                          fcfg.SERVERLESS: list(defaults(fcfg.ServerlessSpec)), fcfg.RUN: ["trials", "seed"]}),
        (run_task, {fcfg.TASK: list(defaults(fcfg.TaskSpec)), fcfg.RUN: ["trials", "seed"]}),
        (FederatedSparsePCA.__init__, {fcfg.ESTIMATOR: list(defaults(fcfg.EstimatorSpec)), fcfg.SPEC: list(est)}),
    ]


@pytest.mark.parametrize("index", range(9))
def test_every_entry_points_defaults_are_its_specs(index):
    fn, specs = _entry_points()[index]
    got = _defaults(fn)
    for spec, names in specs.items():
        for name in names:
            assert name in got, f"{fn.__qualname__} has no keyword {name} of {type(spec).__name__}"
            assert got[name] == getattr(spec, name), f"{fn.__qualname__}({name}=...) is not {type(spec).__name__}'s"


#: (spec class, field, a value of the wrong type or outside its rule, the message's start)
BAD = [
    (scfg.SymNMFSpec, "max_iter", 2.5, "max_iter: must be an integer, got 2.5 (float)"),
    (scfg.SymNMFSpec, "max_iter", 100.0, "max_iter: must be an integer, got 100.0"),
    (scfg.SymNMFSpec, "max_iter", "100", "max_iter: must be an integer, got '100' (str)"),
    (scfg.SymNMFSpec, "tol", True, "tol: must be a number, got True (bool)"),
    (scfg.SymNMFSpec, "method", "nmf", "method: unknown value 'nmf'"),
    (scfg.SymNMFSpec, "penalty", "fixed", "penalty: unknown value 'fixed'"),
    (scfg.SymNMFSpec, "penalty", [0.1, -1.0], "penalty[1]: must be >= 0"),
    (scfg.AgentsSpec, "mu", "big", "mu: unknown value 'big'"),
    (scfg.AgentsSpec, "n_agents", 0, "n_agents: must be >= 1"),
    (scfg.AgentsSpec, "exchange", "secret", "exchange: unknown value 'secret'"),
    (scfg.ClusteringSpec, "n_clusters", "2", "n_clusters: must be an integer, got '2' (str)"),
    (scfg.ClusteringSpec, "dtype", "float16", "dtype: unknown value 'float16'"),
    (scfg.RankSpec, "share", "some", "share: unknown value 'some'"),
    (fcfg.TaskSpec, "alpha", "big", "alpha: must be a number or a list of numbers"),
    (fcfg.FSSPCASpec, "inner_steps", 1.5, "inner_steps: must be an integer, got 1.5 (float)"),
    (fcfg.FSSPCASpec, "rho", "server", "rho: unknown value 'server'"),
    (fcfg.FSSPCASpec, "center", 1, "center: must be true or false, got 1 (int)"),
    (fcfg.FSSPCASpec, "mu", float("nan"), "mu: must be a finite number"),
    (fcfg.ServerlessSpec, "consensus", "gossip", "consensus: unknown value 'gossip'"),
    (fcfg.TaskSpec, "n_workers", None, "n_workers: is required, got None"),
    (scfg.RunSpec, "checkpoint_every", -1, "checkpoint_every: must be >= 0"),
    (fcfg.RunSpec, "trials", 1.5, "trials: must be an integer, got 1.5"),
    (fcfg.EstimatorSpec, "n_components", "2", "n_components: must be an integer or None, got '2' (str)"),
    (fcfg.EstimatorSpec, "dtype", "float16", "dtype: unknown value 'float16'"),
]


@pytest.mark.parametrize("cls, name, value, line", BAD, ids=[f"{c.__name__}.{n}={v!r}" for c, n, v, _ in BAD])
def test_a_spec_refuses_a_wrong_type_with_one_line(cls, name, value, line):
    with pytest.raises(ConfigError) as info:
        cls(**{name: value})
    assert str(info.value).startswith(line)
    assert info.value.key.split("[")[0] == name and "\n" not in str(info.value)


@pytest.mark.parametrize("cls", [scfg.SymNMFSpec, scfg.AgentsSpec, scfg.ClusteringSpec, scfg.RankSpec,
                                 scfg.RunSpec, fcfg.FSSPCASpec, fcfg.ServerlessSpec, fcfg.TaskSpec,
                                 fcfg.EstimatorSpec, fcfg.RunSpec])
def test_every_field_of_every_spec_refuses_a_mapping(cls):
    """A dict is no setting's type: each field, fed one, names itself (and the spec is frozen)."""
    spec = cls()
    for f in dataclasses.fields(cls):
        with pytest.raises(ConfigError) as info:
            cls(**{f.name: {"a": 1}})
        assert info.value.key == f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(spec, dataclasses.fields(cls)[0].name, None)


def test_a_spec_takes_numpy_integers_and_an_int_for_a_float():
    s = scfg.ClusteringSpec(n_clusters=np.int64(3), tol=0)
    assert type(s.n_clusters) is int and s.n_clusters == 3 and type(s.tol) is float
    assert fcfg.TaskSpec(alpha=[0, 1.5]).alpha == [0.0, 1.5]


def test_build_takes_an_integral_float_from_a_config_and_names_the_dotted_key():
    @dataclasses.dataclass
    class Run:
        solver: scfg.SymNMFSpec = dataclasses.field(default_factory=scfg.SymNMFSpec)

    assert build(Run, {"solver": {"max_iter": 1e3}}).solver.max_iter == 1000
    with pytest.raises(ConfigError, match=r"^solver\.max_iter: must be an integer, got 2\.5"):
        build(Run, {"solver": {"max_iter": 2.5}})
    with pytest.raises(ConfigError, match=r"^solver\.bogus: unknown key"):
        build(Run, {"solver": {"bogus": 1}})


@pytest.mark.parametrize("kw, key", [
    (dict(n_clusters="2"), "n_clusters"), (dict(dtype="float16"), "dtype"), (dict(max_iter=10.0), "max_iter"),
    (dict(method="nmf"), "method"), (dict(n_init=True), "n_init"),
])
def test_symmetric_nmf_refuses_a_wrong_parameter(kw, key):
    from ppdnmf_torch.models.symnmf.estimator import SymmetricNMF

    X = np.random.default_rng(0).random((12, 3))
    with pytest.raises(ConfigError) as info:
        SymmetricNMF(**kw).fit(X)
    assert info.value.key == key


@pytest.mark.parametrize("kw, key", [
    (dict(n_components="2"), "n_components"), (dict(alpha="big"), "alpha"), (dict(dtype="float16"), "dtype"),
    (dict(max_iter=10.0), "max_iter"), (dict(n_workers=2.0), "n_workers"),
])
def test_federated_sparse_pca_refuses_a_wrong_parameter(kw, key):
    from ppdnmf_torch.models.fsspca.estimator import FederatedSparsePCA

    X = np.random.default_rng(0).normal(size=(12, 4))
    with pytest.raises(ConfigError) as info:
        FederatedSparsePCA(**kw).fit(X)
    assert info.value.key == key
