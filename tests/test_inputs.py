"""Every bad input of every task is one error line naming its key (issue 42; issue 44's "Raw
tracebacks" and "Silent" items): the Python API raises a ``DataError``/``ConfigError``/``GraphError``
keyed by the parameter that named the input, the CLI prints ``ppdnmf: error: <config key>: ...``
and exits with code 2.

The files: empty, truncated, object dtype, text in a ``.npy``, binary bytes or words in a
``.csv``, a damaged ``.npz`` or ``.mat``, string, fractional or missing labels, constant data,
data scaled by 1e200 or 1e-200; a graph file naming node 1000000000; a huge ``n_max``.
Python-level cases run in the default run; two CLI runs check the mapping to config keys and
exit 2, the rest of the CLI cases are ``slow``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.errors import ConfigError, DataError, DegenerateResultWarning, GraphError
from ppdnmf_torch.models import fsspca
from ppdnmf_torch.models.fsspca.experiments import run_task
from ppdnmf_torch.models.symnmf.presets import load_preset
from ppdnmf_torch.models.symnmf.similarity import similarity_matrix

ROOT = Path(__file__).resolve().parents[1]


# -- the bad files, by kind --------------------------------------------------------------
def _npy_bytes(arr) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


_GOOD = _npy_bytes(np.arange(12.0).reshape(4, 3))
#: name -> (file name, bytes, expected message after the key)
NPY_FILES = {
    "empty npy": ("x.npy", b"", r"does not start with the \.npy magic bytes: it is empty"),
    "truncated npy": ("x.npy", _GOOD[:-10], r"is truncated: its header promises \(4, 3\) float64"),
    "header only": ("x.npy", _GOOD[:20], r"damaged \.npy header"),
    "object npy": ("x.npy", _npy_bytes(np.array([{"a": 1}, None], dtype=object)), r"holds Python objects"),
    "text in npy": ("x.npy", b"1,2\n3,4\n", r"it is a text file"),
    "string npy": ("x.npy", _npy_bytes(np.array([["a", "b"], ["c", "d"]])), r"must hold real numbers, got dtype <U1"),
    "1-D npy": ("x.npy", _npy_bytes(np.arange(5.0)), r"must be a 2-D"),
    "NaN npy": ("x.npy", _npy_bytes(np.array([[1.0, np.nan], [2.0, 3.0]])), r"entry \(0, 1\) is nan"),
}
CSV_FILES = {
    "empty csv": ("x.csv", b"", r"matrix is empty"),
    "words csv": ("x.csv", b"a,b\nc,d\n", r"is not a numeric matrix: could not convert string 'a'"),
    "binary csv": ("x.csv", bytes(range(256)) * 8, r"is not a text file \(it holds binary bytes\)"),
    "ragged csv": ("x.csv", b"1,2\n3\n", r"the number of columns changed"),
    "latin-1 csv": ("x.csv", b"1,2\n\xe9,3\n", r"is not a numeric matrix"),
}


def _write(tmp_path, name, content) -> str:
    p = tmp_path / name
    p.write_bytes(content)
    return str(p)


# -- PPDNMF's loaders ----------------------------------------------------------------------
@pytest.mark.parametrize("case", list(NPY_FILES) + list(CSV_FILES))
def test_ppdnmf_loaders_name_every_bad_file(tmp_path, case):
    name, content, match = {**NPY_FILES, **CSV_FILES}[case]
    path = _write(tmp_path, name, content)
    kind = name.rsplit(".", 1)[1]
    with pytest.raises(DataError, match=r"^path: .*" + match) as info:
        pp.data.load_matrix(kind, path)
    assert info.value.key == "path" and "\n" not in str(info.value)


def test_a_npy_header_is_read_without_the_data(tmp_path):
    path = _write(tmp_path, "x.npy", _GOOD)
    assert pp.data.matrix_shape("npy", path) == (4, 3)
    assert pp.data.matrix_shape("csv", _write(tmp_path, "x.csv", b"# comment\n1,2,3\n\n4,5,6\n")) == (2, 3)


# -- FSSPCA ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(NPY_FILES) + list(CSV_FILES))
def test_fsspca_files_are_one_line_each(tmp_path, case):
    name, content, match = {**NPY_FILES, **CSV_FILES}[case]
    path = _write(tmp_path, name, content)
    with pytest.raises(DataError, match=r"^path: .*" + match):
        run_task(data=path, n_workers=2, max_iter=2)


def test_fsspca_a_missing_file_is_reported_as_missing(tmp_path):
    with pytest.raises(DataError, match=r"^path: data file not found: .*nope\.npy"):
        fsspca.data.load_rows(str(tmp_path / "nope.npy"))


@pytest.mark.parametrize("scale, match", [
    (1e200, r"^data: entries up to \d\.\d+e\+200 overflow the covariance in float64"),
    (1e-200, r"^data: entries up to .*e-20[01] make the covariance underflow to 0"),
    (0.0, r"^data: every one of the 4 features is constant over the 40 rows"),
])
def test_fsspca_data_without_a_covariance_is_refused(scale, match):
    X = np.random.default_rng(0).standard_normal((40, 4)) * scale
    with pytest.raises(DataError, match=match):
        fsspca.fit_fsspca(X, 2, groups=np.arange(40) % 4, max_iter=2)


def test_fsspca_constant_rows_are_named_not_called_rho_zero():
    X = np.tile(np.arange(4.0), (40, 1))  # every feature constant: "rho: must be > 0, got auto" before
    with pytest.raises(DataError, match=r"^data: every one of the 4 features is constant"):
        fsspca.fit_fsspca(X, 2, groups=np.arange(40) % 4, max_iter=2)


# -- symmetric NMF ---------------------------------------------------------------------------
_SIM = np.array([[0.0, 1.0, 0.2], [1.0, 0.0, 0.5], [0.2, 0.5, 0.0]])


@pytest.mark.parametrize("case", ["empty npy", "truncated npy", "object npy", "text in npy", "string npy",
                                  "NaN npy", "empty csv", "words csv", "binary csv"])
def test_symnmf_similarity_files_are_one_line_each(tmp_path, case):
    name, content, match = {**NPY_FILES, **CSV_FILES}[case]
    path = _write(tmp_path, name, content)
    with pytest.raises(DataError, match=r"^path: .*" + match):
        load_preset("similarity", path=path)


@pytest.mark.parametrize("content, match", [
    (b"", r"cannot read .* as a scipy\.sparse \.npz matrix"),
    (b"PK\x03\x04garbage", r"cannot read .* as a scipy\.sparse \.npz matrix"),
    (None, r"cannot read .* as a scipy\.sparse \.npz matrix"),  # a numpy .npz, not a sparse one
])
def test_symnmf_a_damaged_npz_is_one_line(tmp_path, content, match):
    path = tmp_path / "s.npz"
    if content is None:
        np.savez(path, a=_SIM)
    else:
        path.write_bytes(content)
    with pytest.raises(DataError, match=r"^path: " + match):
        load_preset("similarity", path=str(path))


@pytest.mark.parametrize("S, match", [
    (np.ones((2, 3)), r"must be square"),
    (-_SIM, r"must be nonnegative"),
    (_SIM + np.triu(_SIM), r"must be symmetric"),
    (np.zeros((3, 3)), r"is all zero"),
])
def test_symnmf_a_similarity_that_cannot_be_one_is_named_by_its_file(tmp_path, S, match):
    path = tmp_path / "s.npy"
    np.save(path, S)
    with pytest.raises(DataError, match=r"^path: .*" + match):
        load_preset("similarity", path=str(path))


@pytest.mark.parametrize("content, match", [
    (b"a\nb\nc\n", r"holds 'a', not a number; labels must be integers"),
    (b"", r"holds no labels"),
    (b"0\n1.5\n1\n", r"label 1 .* is 1\.5, not an integer \(labels are never truncated\)"),
    (b"0\n1\n", r"holds 2 labels for 3 samples"),
    (b"\x00\x01\x02", r"is not a text file"),
])
def test_symnmf_bad_labels_are_named_under_labels_path(tmp_path, content, match):
    sim = tmp_path / "s.npy"
    np.save(sim, _SIM)
    labels = _write(tmp_path, "y.csv", content)
    with pytest.raises(DataError, match=r"^labels_path: .*" + match) as info:
        load_preset("similarity", path=str(sim), labels_path=labels)
    assert info.value.key == "labels_path"


def test_symnmf_whole_float_labels_are_integers_and_a_missing_file_is_labels_path(tmp_path):
    sim = tmp_path / "s.npy"
    np.save(sim, _SIM)
    out = load_preset("similarity", path=str(sim), labels_path=_write(tmp_path, "y.csv", b"0\n1.0\n1\n"))
    assert out["labels"].tolist() == [0, 1, 1] and out["rank"] == 2
    with pytest.raises(DataError, match=r"^labels_path: labels file not found: .*nope\.npy"):
        load_preset("similarity", path=str(sim), labels_path=str(tmp_path / "nope.npy"))


@pytest.mark.parametrize("case", ["text in npy", "truncated npy", "words csv", "empty csv"])
def test_symnmf_samples_files_are_one_line_each(tmp_path, case):
    name, content, match = {**NPY_FILES, **CSV_FILES}[case]
    with pytest.raises(DataError, match=r"^path: .*" + match):
        load_preset("samples", path=_write(tmp_path, name, content))


@pytest.mark.parametrize("content", [b"", b"MATLAB 5.0 MAT-file" + b"\x00" * 20, b"not a mat file at all"])
def test_symnmf_a_damaged_orl_file_is_one_line(tmp_path, content):
    with pytest.raises(DataError, match=r"^path: cannot read .* as a MATLAB \.mat file"):
        load_preset("orl", path=_write(tmp_path, "orl_faces.mat", content))


def test_symnmf_an_orl_file_without_its_arrays_is_named(tmp_path):
    import scipy.io

    path = tmp_path / "orl_faces.mat"
    scipy.io.savemat(path, {"X": np.ones((3, 3))})
    with pytest.raises(DataError, match=r"^path: .* has no 'data' and 'label' arrays"):
        load_preset("orl", path=str(path))


def test_symnmf_identical_samples_are_warned_about():
    with pytest.warns(DegenerateResultWarning, match=r"^M: all 20 samples are identical \(all zero\)"):
        similarity_matrix(np.zeros((20, 4)))


# -- graphs and the codec -------------------------------------------------------------------
@pytest.mark.parametrize("lines, match", [
    (["0 1", "1 1000000000"], r"its largest node id is 1000000000, so there are 1000000001 agents"),
    (["# n_agents: 1000000000", "0 1"], r"its header says n_agents: 1000000000"),
])
def test_a_graph_file_naming_a_billion_nodes_is_refused_at_once(tmp_path, lines, match):
    path = tmp_path / "g.txt"
    path.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(GraphError, match=r"graph is disconnected: " + match):
        pp.graph.from_edge_list(str(path))
    assert time.perf_counter() - t0 < 5  # no billion-node structure was made


@pytest.mark.parametrize("n_max, match", [
    (1e300, r"^n_max: 1e\+300 is above the largest scale the codec holds, 2\^62"),
    (2.0 ** 63, r"^n_max: 9\.22337e\+18 is above the largest scale"),
])
def test_a_huge_n_max_is_one_line_not_an_overflow(n_max, match):
    with pytest.raises(ConfigError, match=match):
        pp.fit(torch.rand(6, 8), pp.graph.ring(4), 2, exchange="quantized", n_max=n_max, bcd_iters=1)


def test_data_far_larger_than_n_max_allows_is_one_line():
    # the codec's bound in log2: data of 1e300 (and n_max = 2^62) no longer overflows a float; the
    # exchanged copies are bounded by the start's scale, not the data's, so the line names the n_max that fits
    with pytest.raises(ConfigError, match=r"^key_bits/n_max: .* n_max <= [0-9.e+]+ fits"):
        pp.fit(torch.rand(6, 8, dtype=torch.float64) * 1e300, pp.graph.ring(4), 2, exchange="quantized", n_max=2.0 ** 62, bcd_iters=1)


# -- the CLI: the config's keys, exit 2, one line --------------------------------------------
def _cli(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "ppdnmf_torch", *args, f"hydra.run.dir={cwd / 'run'}",
                           "progress=false", "logger=none"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _one_error_line(r, prefix):
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ppdnmf: error:")]
    assert len(errors) == 1 and errors[0].startswith("ppdnmf: error: " + prefix), r.stderr
    assert "Traceback" not in r.stderr, r.stderr


CLI_CASES = {
    "fsspca truncated npy": (["task=fsspca", "data.kind=npy", "data.path={truncated npy}"], "data.path: "),
    "symnmf missing labels": (["task=symnmf", "data.preset=similarity", "data.path={good npy}",
                               "data.labels_path=nope.npy"], "data.labels_path: labels file not found"),
    "fsspca object npy": (["task=fsspca", "data.kind=npy", "data.path={object npy}"], "data.path: "),
    "fsspca binary csv": (["task=fsspca", "data.kind=csv", "data.path={binary csv}"], "data.path: "),
    "fsspca empty csv": (["task=fsspca", "data.kind=csv", "data.path={empty csv}"], "data.path: "),
    "fsspca missing file": (["task=fsspca", "data.kind=npy", "data.path=nope.npy"], "data.path: data file not found"),
    "symnmf empty similarity": (["task=symnmf", "data.preset=similarity", "data.path={empty npy}"], "data.path: "),
    "symnmf string labels": (["task=symnmf", "data.preset=similarity", "data.path={good npy}",
                              "data.labels_path={words csv}"], "data.labels_path: "),
    "symnmf text samples": (["task=symnmf", "data.preset=samples", "data.path={text in npy}"], "data.path: "),
    "symnmf corrupt ORL": (["task=symnmf", "data.preset=orl", "data.path={corrupt mat}"], "data.path: "),
    "symnmf n=200000": (["task=symnmf", "data.n=200000"], "data.n: 200000 samples (a dense similarity) need"),
    "n_max 1e300": (["exchange=quantized", "exchange.n_max=1e300"], "exchange.n_max: "),
    "trials 1e9": (["trials=1000000000"], "trials: 1000000000 trials need about"),
}
DEFAULT_CLI = ("fsspca truncated npy", "symnmf missing labels", "trials 1e9")


@pytest.mark.parametrize("case", [c if c in DEFAULT_CLI else pytest.param(c, marks=pytest.mark.slow)
                                  for c in CLI_CASES])
def test_the_cli_gives_one_line_and_exit_2(tmp_path, case):
    files = {**NPY_FILES, **CSV_FILES}
    names = {}
    for key, (name, content, _) in files.items():
        names[key] = _write(tmp_path, key.replace(" ", "_") + "." + name.rsplit(".", 1)[1], content)
    names["good npy"] = str(tmp_path / "good.npy")
    np.save(names["good npy"], _SIM)
    names["corrupt mat"] = _write(tmp_path, "orl_faces.mat", b"MATLAB 5.0 MAT-file" + b"\x00" * 20)
    args, prefix = CLI_CASES[case]
    _one_error_line(_cli([a.format(**{k: v for k, v in names.items()}) if "{" in a else a for a in args], tmp_path),
                    prefix)
