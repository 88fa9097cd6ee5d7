"""The Hydra config tree (conf/) composes, and converts to validated typed dataclasses."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.models.ppdnmf.config import (
    DataConfig,
    GraphConfig,
    RunConfig,
    SolverConfig,
    SplitConfig,
    from_dict,
    to_dict,
)

hydra = pytest.importorskip("hydra")
from hydra import compose, initialize_config_dir  # noqa: E402

from ppdnmf_torch.app.cli import CONFIG_DIR, to_run_config  # noqa: E402

CONF = Path(CONFIG_DIR)
GROUPS = ("data", "graph", "solver", "consensus", "exchange", "logger", "experiment")

# values a group option needs before it converts (file kinds need a path)
_NEEDS = {
    ("data", "cbcl"): ["data.path=/nonexistent/faces.mat"],
    ("experiment", "paper_cbcl"): ["data.path=/nonexistent/faces.mat"],
    ("experiment", "incremental_cbcl"): ["data.path=/nonexistent/faces.mat"],
    ("data", "npy"): ["data.path=/nonexistent/z.npy"],
    ("data", "csv"): ["data.path=/nonexistent/z.csv"],
    ("graph", "file"): ["graph.path=/nonexistent/edges.txt"],
}


def _options():
    for group in GROUPS:
        for f in sorted((CONF / group).glob("*.yaml")):
            yield group, f.stem


def _compose(overrides=()):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_config_tree_is_complete():
    opts = {}
    for group, name in _options():
        opts.setdefault(group, set()).add(name)
    assert opts["data"] == {"synthetic", "cbcl", "npy", "csv"}
    assert opts["graph"] == {"random", "ring", "star", "complete", "grid", "erdos_renyi", "random_geometric", "file"}
    assert opts["solver"] == {"default"}
    assert opts["exchange"] == {"plain", "quantized", "paillier", "secagg"}
    assert opts["logger"] == {"tensorboard", "none"}
    assert opts["consensus"] == {"admm", "i_admm", "pi_admm", "pi_admm2"}
    assert opts["experiment"] == {"paper_synthetic", "paper_cbcl", "incremental_synthetic", "incremental_cbcl"}


@pytest.mark.parametrize("group,name", list(_options()), ids=lambda x: str(x))
def test_every_group_option_composes_and_converts(group, name):
    cfg = _compose([f"{group}={name}", *_NEEDS.get((group, name), [])])
    rc = to_run_config(cfg)
    assert isinstance(rc, RunConfig)
    if group == "experiment":
        assert rc.name == name
    elif group == "solver":
        assert rc.solver.rank >= 1
    elif group == "consensus":
        assert rc.solver.x_solver == name
    else:
        assert getattr(rc, group).kind == name


def test_default_is_paper_synthetic():
    rc = to_run_config(_compose())
    assert rc.name == "paper_synthetic"
    assert (rc.n_agents, rc.seed, rc.centralized, rc.progress) == (10, 0, True, True)
    assert (rc.data.kind, rc.data.negative) == ("synthetic", "allow")
    assert rc.data.synthetic_kwargs() == {"L": 30, "M": 200, "K": 5, "x_mean": 0.033, "y_mean": 0.8,
                                          "noise_var": 3.6e-4}
    assert (rc.data.split.lo, rc.data.split.hi) == (4, 40)
    assert (rc.graph.kind, rc.graph.avg_degree) == ("random", 3.0)
    s = rc.solver
    assert (s.rank, s.mu, s.eta, s.g_max, s.bcd_iters, s.x_iters, s.y_iters) == (5, 0.1, 1.0, 0.033, 100, 30, 30)
    assert rc.exchange.kind == "plain"  # the paper's preset names it (its schedule draws a weight per edge)
    assert rc.logger.kind == "tensorboard"
    # the dataclass defaults are the same experiment, but for the exchange: the secure sum by default
    assert RunConfig().exchange.kind == "secagg"
    assert replace(RunConfig(), name="paper_synthetic", exchange=rc.exchange) == rc


def test_paper_cbcl_experiment(monkeypatch):
    monkeypatch.delenv("PPDNMF_CBCL", raising=False)
    rc = to_run_config(_compose(["experiment=paper_cbcl", "data.path=faces/cbcl_faces_train.mat"]))
    assert rc.data.kind == "cbcl" and rc.data.image_shape == [19, 19]
    assert Path(rc.data.path).is_absolute() and rc.data.path.endswith("faces/cbcl_faces_train.mat")
    assert (rc.data.split.lo, rc.data.split.hi) == (224, 245)
    assert (rc.n_agents, rc.graph.kind, rc.graph.avg_degree) == (10, "random", 3.0)
    s = rc.solver
    assert (s.rank, s.mu, s.eta, s.g_max, s.bcd_iters, s.x_iters, s.y_iters) == (49, 2.0, 2.0, 0.05, 100, 30, 30)


def test_cbcl_path_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PPDNMF_CBCL", str(tmp_path / "faces.mat"))
    rc = to_run_config(_compose(["experiment=paper_cbcl"]))
    assert rc.data.path == str(tmp_path / "faces.mat")


def test_cbcl_has_no_default_path_and_says_where_to_get_the_file(monkeypatch):
    # no path outside the repository: data.path or $PPDNMF_CBCL, else an error with the source
    monkeypatch.delenv("PPDNMF_CBCL", raising=False)
    with pytest.raises(ConfigError, match=r"^data\.path: no CBCL data file given.*cbcl\.mit\.edu.*PPDNMF_CBCL"):
        to_run_config(_compose(["experiment=paper_cbcl"]))
    text = (CONF / "data" / "cbcl.yaml").read_text()
    assert "shared" not in text and "../" not in text


def test_crypto_exchange_defaults():
    from ppdnmf_torch.exchange import PaillierSpec, PlainSpec, QuantizedSpec

    for kind in ("quantized", "paillier"):
        e = to_run_config(_compose([f"exchange={kind}"])).exchange
        assert (e.kind, e.protocol, e.key_bits, e.n_max, e.g_bits) == (kind, "masked", 2048, 1e6, 16)
    # the YAML of a kind holds that kind's keys: quantized counts as the packing real stage does
    assert to_run_config(_compose(["exchange=quantized"])).exchange == QuantizedSpec(cost_model=True, packing=True)
    assert to_run_config(_compose(["exchange=plain"])).exchange == PlainSpec()
    rc = to_run_config(_compose(["exchange=paillier", "exchange.cost_model=true", "exchange.protocol=paper",
                                 "exchange.djn=true", "exchange.workers=2"]))
    assert rc.exchange == PaillierSpec(cost_model=True, protocol="paper", djn=True, workers=2)


def test_each_exchange_yaml_holds_its_own_keys():
    """conf/exchange/<kind>.yaml sets exactly that kind's config keys; another kind's key is
    refused by Hydra (not in the composed config) and by from_dict (naming the kind)."""
    import yaml

    from ppdnmf_torch.models.ppdnmf.config import exchange_keys

    for kind in ("plain", "quantized", "paillier"):
        with open(os.path.join(CONFIG_DIR, "exchange", f"{kind}.yaml"), encoding="utf-8") as fh:
            keys = set(yaml.safe_load(fh)) - {"kind"}
        assert keys == set(exchange_keys(kind)), kind
    with pytest.raises(Exception, match="n_max"):
        _compose(["exchange=plain", "exchange.n_max=10"])
    with pytest.raises(ConfigError, match=r"^exchange\.n_max: does not apply to exchange\.kind=plain"):
        from_dict({"exchange": {"kind": "plain", "n_max": 10.0}})


def test_command_line_groups_win_over_the_experiment():
    rc = to_run_config(_compose(["experiment=paper_cbcl", "data=synthetic", "solver.rank=5", "exchange=quantized",
                                 "graph=ring"]))
    assert (rc.data.kind, rc.exchange.kind, rc.graph.kind, rc.solver.mu) == ("synthetic", "quantized", "ring", 2.0)


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["solver.mu=-1"], "solver.mu"),
        (["solver.eta=0"], "solver.eta"),
        (["solver.g_max=0"], "solver.g_max"),
        (["solver.g_max=[0.1,0.2]"], "solver.g_max"),
        (["solver.bcd_iters=0"], "solver.bcd_iters"),
        (["solver.x_iters=2.5"], "solver.x_iters"),
        (["solver.y_iters=abc"], "solver.y_iters"),
        (["solver.rank=0"], "solver.rank"),
        (["solver.rank=31"], "solver.rank"),
        (["solver.tol=-1e-3"], "solver.tol"),
        (["solver.admm_tol=-1"], "solver.admm_tol"),
        (["solver.penalty=gaussian"], "solver.penalty"),
        (["solver.consensus_form=printed"], "solver.consensus_form"),
        (["exchange.kind=rsa"], "exchange.kind"),
        (["exchange=quantized", "exchange.protocol=mixed"], "exchange.protocol"),
        (["exchange=quantized", "exchange.n_max=0.5"], "exchange.n_max"),
        (["exchange=quantized", "exchange.key_bits=8"], "exchange.key_bits"),
        (["exchange=quantized", "exchange.g_bits=31"], "exchange.g_bits"),
        (["exchange=paillier", "exchange.workers=-1"], "exchange.workers"),
        (["exchange=paillier", "exchange.key_bits=65"], "exchange.key_bits"),
        (["exchange=quantized", "exchange.cost_model=1"], "exchange.cost_model"),
        (["data.kind=hdf5"], "data.kind"),
        (["data.negative=ignore"], "data.negative"),
        (["data.noise_var=-1"], "data.noise_var"),
        (["data.M=5"], "data.M"),
        (["data.split.lo=30"], "data.split.lo"),
        (["data.split.lo=30", "data.split.hi=20"], "data.split.lo"),
        (["data.split.hi=10"], "data.split.hi"),
        (["data=npy"], "data.path"),
        (["data=cbcl", "data.path=''"], "data.path"),
        (["graph=erdos_renyi", "graph.p=1.5"], "graph.p"),
        (["graph=random_geometric", "graph.radius=-0.1"], "graph.radius"),
        (["graph=grid", "graph.rows=3"], "graph.rows"),
        (["graph=file"], "graph.path"),
        (["graph.avg_degree=12"], "graph.avg_degree"),
        (["logger.kind=wandb"], "logger.kind"),
        (["logger.n_samples=0"], "logger.n_samples"),
        (["n_agents=0"], "n_agents"),
        (["n_agents=3"], "data.split.hi"),
        (["seed=-1"], "seed"),
        (["device=tpu"], "device"),
        (["dtype=float16"], "dtype"),
        (["centralized=maybe"], "centralized"),
        (["progress=1"], "progress"),
        (["+extra=1"], "extra"),
        (["+solver.momentum=0.9"], "solver.momentum"),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, list) else x,
)
def test_bad_values_name_the_key(overrides, key):
    cfg = _compose(overrides)
    with pytest.raises(ConfigError) as exc_info:
        to_run_config(cfg)
    assert str(exc_info.value).startswith(f"{key}:"), str(exc_info.value)


def test_from_dict_roundtrip_and_defaults():
    cfg = RunConfig()
    assert from_dict(to_dict(cfg)) == cfg
    assert from_dict({}) == cfg
    rc = from_dict({"solver": {"mu": 1, "g_max": [0.1] * 10}, "graph": {"kind": "random_connected"}})
    assert rc.solver.mu == 1.0 and isinstance(rc.solver.mu, float)
    assert rc.solver.g_max == [0.1] * 10
    assert rc.graph.kind == "random"
    assert from_dict({"hydra": {"anything": 1}}) == cfg


@pytest.mark.parametrize(
    "d,key",
    [
        ([1, 2], "config"),
        ({"solver": 3}, "solver"),
        ({"solver": {"mu": float("nan")}}, "solver.mu"),
        ({"solver": {"mu": True}}, "solver.mu"),
        ({"solver": {"rank": None}}, "solver.rank"),
        ({"data": {"kind": "cbcl", "path": "x.mat", "L": 30}}, "data.L"),
        ({"data": {"kind": "synthetic", "path": "x.mat"}}, "data.path"),
        ({"data": {"kind": "npy", "path": "x.npy", "delimiter": ";"}}, "data.delimiter"),
        ({"data": {"image_shape": [5, 5]}}, "data.image_shape"),
        ({"data": {"image_shape": [30]}}, "data.image_shape"),
        ({"data": {"split": {"counts": [20] * 10, "lo": 4}}}, "data.split.counts"),
        ({"data": {"split": {"counts": [20] * 9}}}, "data.split.counts"),
        ({"data": {"split": {"counts": [10] * 10}}}, "data.split.counts"),
        ({"data": {"split": {"counts": [0] + [20] * 9}}}, "data.split.counts[0]"),
        ({"graph": {"kind": "ring", "avg_degree": 3}}, "graph.avg_degree"),
        ({"graph": {"kind": "complete", "path": "e.txt"}}, "graph.path"),
        ({"graph": {"kind": "erdos_renyi"}}, "graph.p"),
        ({"exchange": {"kind": "quantized", "n_max": "big"}}, "exchange.n_max"),
        ({"exchange": {"kind": "plain", "n_max": 1e4}}, "exchange.n_max"),  # plain takes no settings
        ({"exchange": {"kind": "quantized", "workers": 2}}, "exchange.workers"),
        ({"exchange": {"kind": "paillier", "keypairs": []}}, "exchange.keypairs"),  # API only
        ({"solver": {"g_max": []}}, "solver.g_max"),
        ({"solver": {"mu": [1.0]}}, "solver.mu"),
    ],
)
def test_from_dict_rejects(d, key):
    with pytest.raises(ConfigError) as exc_info:
        from_dict(d)
    assert str(exc_info.value).startswith(f"{key}:"), str(exc_info.value)


def test_validate_hand_built_configs():
    cfg = RunConfig(data=DataConfig(kind="cbcl", path="faces.mat", split=SplitConfig(lo=224, hi=245)),
                    solver=SolverConfig(rank=49, mu=2.0, eta=2.0, g_max=0.05), graph=GraphConfig(kind="ring"))
    assert cfg.validate() is cfg
    with pytest.raises(ConfigError, match=r"^mu: must be > 0, got -1"):  # the frozen spec checks on construction
        SolverConfig(mu=-1)
    bad = RunConfig(data=DataConfig(kind="bogus"))
    with pytest.raises(ConfigError, match=r"^data\.kind: unknown value 'bogus'"):
        bad.validate()


def test_core_imports_neither_hydra_nor_tensorboard():
    code = (
        "import sys, ppdnmf_torch, ppdnmf_torch.models.ppdnmf.config, ppdnmf_torch.app.runner;"
        "bad = [m for m in ('hydra', 'omegaconf', 'tensorboard', 'torch.utils.tensorboard') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
