"""The ``ppdnmf`` app end to end: CLI smoke runs, multirun, user errors, the runner, TensorBoard."""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ppdnmf_torch.models.ppdnmf.config import from_dict
from ppdnmf_torch.app.runner import run

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

TINY = ["solver.bcd_iters=3", "solver.x_iters=3", "solver.y_iters=3"]


ROOT = Path(__file__).resolve().parents[1]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")  # this tree, installed or not
    # tiny problems: one thread avoids OpenMP oversubscription on shared CI cores
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore")
    return env


def _cli(args, cwd, timeout=180):
    return subprocess.run([sys.executable, "-m", "ppdnmf_torch", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def _scalars(tb_dir: Path):
    acc = event_accumulator.EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def _read_csv(path: Path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One CLI run of the default experiment, 3 BCD iterations, shared by the tests below."""
    tmp = tmp_path_factory.mktemp("smoke")
    run_dir = tmp / "run"
    r = _cli([*TINY, f"hydra.run.dir={run_dir}", "progress_interval=1e-6"], cwd=tmp)
    return r, run_dir


def _hparams(tb_dir: Path) -> dict:
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = _scalars(tb_dir)
    content = acc.PluginTagToContent("hparams")
    for blob in content.values():
        data = plugin_data_pb2.HParamsPluginData.FromString(blob)
        if data.HasField("session_start_info"):
            hp = data.session_start_info.hparams
            return {k: (v.string_value or v.number_value or v.bool_value) for k, v in hp.items()}
    raise AssertionError("no hparams in the run's own events")


def test_cli_smoke_run(smoke):
    r, run_dir = smoke
    assert r.returncode == 0, r.stderr
    assert "distributed" in r.stdout and "centralized" in r.stdout
    assert "Traceback" not in r.stderr
    log = (run_dir / "ppdnmf.log").read_text()
    assert "data synthetic" in log and "final NMSE after 3 BCD iterations" in log and "outputs:" in log
    assert r.stdout.count("final NMSE") == 1  # the log file only: not twice on the console
    # resolved config, Hydra's own copy
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    import yaml

    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["solver"]["bcd_iters"] == 3 and saved["name"] == "paper_synthetic"
    assert from_dict(saved).solver.x_iters == 3
    # factors
    f = torch.load(run_dir / "factors.pt", weights_only=True)
    assert f["X"].shape == (10, 30, 5) and f["U"].shape == (10, 30, 5)
    assert len(f["Y"]) == 10 and all(y.shape[0] == 5 for y in f["Y"])
    assert [y.shape[1] for y in f["Y"]] == f["columns"].tolist() and int(f["columns"].sum()) == 200
    assert all(4 <= c <= 40 for c in f["columns"].tolist())
    assert f["edges"].shape == (15, 2)
    assert f["centralized_X"].shape == (30, 5) and f["centralized_Y"].shape == (5, 200)
    # history
    rows = _read_csv(run_dir / "history.csv")
    assert len(rows) == 3
    for col in ("iteration", "nmse", "centralized_nmse", "consensus", "objective", "x_primal", "x_dual",
                "y_primal", "y_dual", "time_x", "time_y"):
        assert col in rows[0], col
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3]
    hist = json.loads((run_dir / "history.json").read_text())
    assert len(hist["distributed"]["nmse"]) == 3 and len(hist["centralized"]["nmse"]) == 3
    assert float(rows[-1]["nmse"]) == pytest.approx(hist["distributed"]["nmse"][-1])
    # summary
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["nmse"]["distributed"] == pytest.approx(float(rows[-1]["nmse"]))
    assert summary["nmse"]["centralized"] == pytest.approx(float(rows[-1]["centralized_nmse"]))
    assert summary["device"] == "cpu" or summary["device"].startswith("cuda")
    assert summary["sizes"]["n_edges"] == 15 and summary["n_iter"]["distributed"] == 3
    assert set(summary["wall_time"]) >= {"distributed", "centralized", "total"}
    # the run is finished: its checkpoints are gone (keep_checkpoints=true keeps them)
    assert not (run_dir / "checkpoints").exists()


def test_cli_logs_progress_lines_off_a_terminal(smoke):
    # stderr is a pipe here: no bar, one log line per interval (iteration, NMSE, consensus, times)
    r, run_dir = smoke
    log = (run_dir / "ppdnmf.log").read_text()
    for i in (1, 2, 3):
        assert f"PPDNMF (plain): BCD iteration {i}/3, NMSE " in log
    line = next(ln for ln in log.splitlines() if "PPDNMF (plain): BCD iteration 2/3" in ln)
    assert "consensus " in line and "elapsed " in line and "ETA " in line
    assert "centralized: BCD iteration 3/3, NMSE" in log
    assert "it/s" not in r.stderr  # no tqdm bar off a terminal


def test_cli_tensorboard_is_one_run_with_the_headline_first(smoke):
    r, run_dir = smoke
    tb = run_dir / "tb"
    assert [p for p in tb.iterdir() if p.is_dir()] == []  # no hparams/ (or any) sub-run
    acc = _scalars(tb)
    tags = set(acc.Tags()["scalars"])
    for tag in ("1_nmse/distributed", "1_nmse/centralized", "2_consensus/error", "2_consensus/log10",
                "3_objective/distributed", "admm/x_primal", "admm/x_dual", "admm/y_primal", "admm/y_dual",
                "time/x_step", "time/y_step", "1_nmse/worst_agent_refit"):
        assert tag in tags, tag
        assert [e.step for e in acc.Scalars(tag)] == [1, 2, 3], tag
    rows = _read_csv(run_dir / "history.csv")
    got = [e.value for e in acc.Scalars("1_nmse/distributed")]
    assert got == pytest.approx([float(r["nmse"]) for r in rows], rel=1e-6)
    logc = [e.value for e in acc.Scalars("2_consensus/log10")]
    assert logc == pytest.approx([math.log10(float(r["consensus"])) for r in rows], rel=1e-5)
    assert sorted(tags)[0].startswith("1_nmse/")  # TensorBoard orders groups by name: NMSE first
    # the Custom Scalars tab: distributed and centralized NMSE in one chart
    from tensorboard.plugins.custom_scalar import layout_pb2

    (event,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    chart = layout.category[0].chart[0]
    assert list(chart.multiline.tag) == ["1_nmse/distributed", "1_nmse/centralized"]
    hp = _hparams(tb)
    assert hp["device"] == "cpu" and hp["dataset"] == "synthetic" and hp["name"] == "paper_synthetic"


def test_cli_help_describes_the_app_and_its_groups(tmp_path):
    r = _cli(["--help"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("ppdnmf: privacy-preserving distributed nonnegative matrix factorization")
    for group in ("data:", "graph:", "exchange:", "experiment:", "solver:", "logger:"):
        assert group in out, group
    assert "NMSE" in out and "resume=" in out and "trials=" in out and "Powered by Hydra" not in out


def test_cli_multirun(tmp_path):
    sweep = tmp_path / "multi"
    r = _cli(["-m", "seed=0,1", *TINY, "solver.bcd_iters=2", "logger=none", "centralized=false",
              f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "summary.json").exists())
    assert [p.name for p in runs] == ["0", "1"]
    s0, s1 = (json.loads((p / "summary.json").read_text()) for p in runs)
    assert s0["nmse"]["centralized"] is None
    assert s0["nmse"]["distributed"] != s1["nmse"]["distributed"]  # different seeds, different data
    assert not (runs[0] / "tb").exists()


def test_cli_bad_value_is_one_line_without_traceback(tmp_path):
    r = _cli(["solver.mu=-1", f"hydra.run.dir={tmp_path / 'bad'}"], cwd=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "mu" in lines[0] and lines[0].startswith("ppdnmf: error: solver.mu:")


def test_cli_missing_data_file(tmp_path):
    r = _cli(["data=npy", "data.path=missing.npy", f"hydra.run.dir={tmp_path / 'bad'}"], cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "data.path" in r.stderr and str(tmp_path / "missing.npy") in r.stderr


@pytest.mark.skipif(shutil.which("ppdnmf") is None, reason="the ppdnmf console script is not installed")
def test_console_script_shows_config(tmp_path):
    r = subprocess.run(["ppdnmf", "--cfg", "job", "experiment=paper_cbcl"], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "name: paper_cbcl" in r.stdout and "rank: 49" in r.stdout


# --------------------------------------------------------------------------------------
# The runner without Hydra
# --------------------------------------------------------------------------------------


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_runner_csv_data_and_file_graph(tmp_path, one_thread):
    gen = torch.Generator().manual_seed(0)
    Z = torch.rand(12, 4, generator=gen, dtype=torch.float64) @ torch.rand(4, 40, generator=gen, dtype=torch.float64)
    with open(tmp_path / "z.csv", "w") as fh:
        fh.write("# a 12 x 40 matrix\n")
        for row in Z.tolist():
            fh.write(",".join(f"{v:.17g}" for v in row) + "\n")
    (tmp_path / "edges.txt").write_text("# n_agents: 4\n0 1\n1 2\n2 3\n")
    cfg = from_dict({
        "n_agents": 4, "centralized": False, "progress": False,
        "data": {"kind": "csv", "path": str(tmp_path / "z.csv"), "split": {"counts": [10, 5, 15, 10]}},
        "graph": {"kind": "file", "path": str(tmp_path / "edges.txt")},
        "solver": {"rank": 4, "bcd_iters": 2, "x_iters": 2, "y_iters": 2, "g_max": [0.1, 0.2, 0.3, 0.4],
                   "penalty_schedule": "adaptive"},  # per-agent caps: the default (agreed) takes one
        "exchange": {"kind": "quantized", "n_max": 1e4},
        "logger": {"kind": "none"},
    })
    summary = run(cfg, tmp_path / "out")
    out = tmp_path / "out"
    assert summary["sizes"] == {"L": 12, "M": 40, "K": 4, "n_agents": 4, "n_edges": 3, "columns": [10, 5, 15, 10]}
    assert summary["nmse"]["centralized"] is None and summary["exchange"]["kind"] == "quantized"
    rows = _read_csv(out / "history.csv")
    assert len(rows) == 2 and "centralized_nmse" not in rows[0]
    assert not (out / "tb").exists()
    f = torch.load(out / "factors.pt", weights_only=True)
    assert f["edges"].tolist() == [[0, 1], [1, 2], [2, 3]]


def test_runner_reports_split_errors_with_the_key(tmp_path):
    from ppdnmf_torch.errors import ConfigError

    z = tmp_path / "z.npy"
    import numpy as np

    np.save(z, np.ones((6, 30)))
    cfg = from_dict({"data": {"kind": "npy", "path": str(z), "split": {"lo": 1, "hi": 2}}, "solver": {"rank": 2},
                     "logger": {"kind": "none"}})
    with pytest.raises(ConfigError, match=r"^data\.split\.hi: 10 agents x hi=2 = 20 columns is less than M=30"):
        run(cfg, tmp_path / "out")


@pytest.mark.crypto
def test_runner_logs_predicted_crypto_costs(tmp_path, one_thread):
    pytest.importorskip("phe")
    cfg = from_dict({
        "n_agents": 4, "centralized": False, "progress": False,
        "data": {"kind": "synthetic", "negative": "allow", "L": 8, "M": 20, "K": 2},
        "graph": {"kind": "ring"},
        "solver": {"rank": 2, "bcd_iters": 2, "x_iters": 2, "y_iters": 2},
        "exchange": {"kind": "quantized", "n_max": 1e3, "key_bits": 256, "cost_model": True},
    })
    summary = run(cfg, tmp_path / "q")
    assert summary["costs"]["encryptions"] > 0 and summary["costs"]["estimated_seconds"] > 0
    if summary["bytes_per_edge"] is not None:  # bytes sent per directed edge, "i->j"
        assert summary["bytes_per_edge"]["0->1"] > 0
    rows = _read_csv(tmp_path / "q" / "history.csv")
    assert len(rows) == 2 and float(rows[1]["crypto_encryptions"]) > float(rows[0]["crypto_encryptions"]) > 0
    acc = _scalars(tmp_path / "q" / "tb")
    tags = set(acc.Tags()["scalars"])
    assert {"crypto/encryptions", "crypto/estimated_seconds", "crypto_admm/encryptions"} <= tags
    assert [e.step for e in acc.Scalars("crypto_admm/encryptions")] == [1, 2, 3, 4]  # 2 BCD x 2 ADMM


def test_tensorboard_crypto_costs_and_grid(tmp_path):
    from ppdnmf_torch.app.tensorboard import TensorBoardLogger, column_images, make_grid

    with TensorBoardLogger(tmp_path / "tb") as tb:
        tb.log_costs({"encryptions": 10, "ciphertext_bytes": 2048.0, "backend": "phe", "ok": True}, step=1)
        tb.log_iteration_costs([{"bcd_iter": 2, "admm_iter": 3, "encryptions": 5}], x_iters=30)
    acc = _scalars(tmp_path / "tb")
    tags = set(acc.Tags()["scalars"])
    assert {"crypto/encryptions", "crypto/ciphertext_bytes", "crypto_admm/encryptions"} <= tags
    assert not any("backend" in t or t.endswith("/ok") for t in tags)
    assert [e.step for e in acc.Scalars("crypto_admm/encryptions")] == [33]
    # Fortran order: pixel (r, c) of a column is entry r + h * c
    v = torch.arange(6.0)[:, None]
    img = column_images(v, (2, 3))[0]
    assert img.tolist() == [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
    g = make_grid(torch.zeros(5, 2, 3), padding=1, scale=2)
    assert g.shape == (1, 2 * (2 * 3 + 1), 2 * (3 * 4 + 1))


def test_runner_cbcl_logs_image_grids(tmp_path, cbcl_path, one_thread):
    cfg = from_dict({
        "name": "paper_cbcl", "progress": False, "n_agents": 10,
        "data": {"kind": "cbcl", "path": str(cbcl_path), "image_shape": [19, 19], "split": {"lo": 224, "hi": 245}},
        "solver": {"rank": 49, "mu": 2.0, "eta": 2.0, "g_max": 0.05, "bcd_iters": 2, "x_iters": 2, "y_iters": 2},
    })
    summary = run(cfg, tmp_path / "cbcl")
    assert summary["sizes"]["L"] == 361 and summary["sizes"]["M"] == 2429
    assert all(224 <= c <= 245 for c in summary["sizes"]["columns"])
    acc = event_accumulator.EventAccumulator(str(tmp_path / "cbcl" / "tb"), size_guidance={"images": 0})
    acc.Reload()
    images = set(acc.Tags()["images"])
    assert {"images/basis", "images/samples"} <= images
    basis = acc.Images("images/basis")[-1]
    assert (basis.width, basis.height) == (4 * (7 * 20 + 1), 4 * (7 * 20 + 1))  # 7 x 7 grid of 19x19, 4x
    samples = acc.Images("images/samples")[-1]
    # faces #1 and #2429: 2 columns; original, distributed and centralized rows
    assert (samples.width, samples.height) == (4 * (2 * 20 + 1), 4 * (3 * 20 + 1))


@pytest.mark.crypto
def test_resumed_run_writes_the_whole_cost_history(tmp_path, one_thread):
    # the crypto_* columns of history.csv and the summary's costs cover both segments
    from ppdnmf_torch.models.ppdnmf.solver import RunInterrupted

    cfg = from_dict({
        "n_agents": 4, "centralized": False, "progress": False, "checkpoint_every": 1,
        "data": {"kind": "synthetic", "negative": "allow", "L": 8, "M": 20, "K": 2},
        "graph": {"kind": "ring"},
        "solver": {"rank": 2, "bcd_iters": 5, "x_iters": 2, "y_iters": 2},
        "exchange": {"kind": "quantized", "n_max": 1e3, "key_bits": 256, "cost_model": True},
        "logger": {"kind": "none"},
    })
    full = run(cfg, tmp_path / "full")

    def interrupt(info):
        if info.iteration == 2:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        run(cfg, tmp_path / "part", callback=interrupt)
    resumed = run(cfg, tmp_path / "part", resume_from=tmp_path / "part" / "checkpoints")
    counts = ("encryptions", "decryptions", "ciphertext_bytes")
    assert {k: resumed["costs"][k] for k in counts} == {k: full["costs"][k] for k in counts}
    rows, ref = _read_csv(tmp_path / "part" / "history.csv"), _read_csv(tmp_path / "full" / "history.csv")
    assert len(rows) == len(ref) == 5
    for k in counts:
        assert [r[f"crypto_{k}"] for r in rows] == [r[f"crypto_{k}"] for r in ref]


@pytest.mark.parametrize("overrides,match", [
    ({"exchange": {"kind": "quantized", "g_bits": 0}}, r"^exchange\.g_bits: .*use exchange\.g_bits >= \d+"),
    ({"exchange": {"kind": "quantized", "n_max": 1e14, "key_bits": 2048}},
     r"^exchange\.key_bits/exchange\.n_max: .*exchange\.n_max"),
    ({"negative": True}, r"^data: has \d+ negative entr(y|ies).*Set data\.negative=clip"),
    ({"n_agents": 9}, r"^n_agents: 9 agents, but the data has only M = 8 columns"),
])
def test_runner_errors_name_the_config_keys(tmp_path, overrides, match):
    # the API names its keywords (g_bits, negative='clip'); a config run names its keys
    import numpy as np

    from ppdnmf_torch.errors import PPDNMFError

    Z = np.random.default_rng(0).random((6, 8))
    if overrides.pop("negative", False):
        Z[0, 0] = -1.0
    np.save(tmp_path / "z.npy", Z)
    d = {"n_agents": overrides.pop("n_agents", 4), "centralized": False, "progress": False,
         "data": {"kind": "npy", "path": str(tmp_path / "z.npy")}, "graph": {"kind": "ring"},
         "solver": {"rank": 2, "bcd_iters": 1, "x_iters": 1, "y_iters": 1}, "logger": {"kind": "none"}}
    d.update(overrides)
    with pytest.raises(PPDNMFError, match=match):
        run(from_dict(d), tmp_path / "out")


def test_a_fresh_run_in_a_used_folder_can_be_resumed(tmp_path):
    # the first run's summary.json must not mark the second, interrupted run as finished
    from ppdnmf_torch.app.resume import resume_target as _resume_target
    from ppdnmf_torch.models.ppdnmf.solver import RunInterrupted

    d = {"n_agents": 4, "centralized": False, "progress": False, "checkpoint_every": 1,
         "data": {"kind": "synthetic", "negative": "allow", "L": 8, "M": 20, "K": 2}, "graph": {"kind": "ring"},
         "solver": {"rank": 2, "bcd_iters": 2, "x_iters": 2, "y_iters": 2}, "logger": {"kind": "none"}}
    out = tmp_path / "run"
    run(from_dict(d), out)
    assert (out / "summary.json").is_file()

    def interrupt(info):
        if info.iteration == 2:
            raise KeyboardInterrupt

    d["solver"]["bcd_iters"] = 6
    with pytest.raises(RunInterrupted):
        run(from_dict(d), out, callback=interrupt)
    assert not (out / "summary.json").exists()
    cfg, folder, ckpt = _resume_target(str(out))
    assert cfg.solver.bcd_iters == 6
    summary = run(cfg, folder, resume_from=ckpt)
    assert summary["n_iter"]["distributed"] == 6


@pytest.mark.parametrize("argv,env,ranks", [
    ([], {}, False), (["exchange=quantized"], {"WORLD_SIZE": "1"}, False), ([], {"WORLD_SIZE": "4"}, True),
    (["distributed.nproc=2"], {}, True), (["+distributed.partition=block"], {}, True),
    (["experiment=paper_cbcl", "name=distributed.run"], {}, False), ([], {"WORLD_SIZE": "x"}, False)])
def test_the_entry_point_picks_the_multi_process_app(argv, env, ranks):
    from ppdnmf_torch.__main__ import wants_ranks

    assert wants_ranks(argv, env) is ranks


@pytest.mark.slow
def test_python_m_ppdnmf_torch_runs_over_ranks_with_a_distributed_override(tmp_path):
    r = _cli(["distributed.nproc=2", *TINY, f"hydra.run.dir={tmp_path}/run"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["distributed"]["world_size"] == 2 and len(summary["distributed"]["ranks"]) == 2
    assert "final NMSE" in r.stdout
