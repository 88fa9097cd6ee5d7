"""Tests of ppdnmf_torch.data: synthetic generator, loaders, column split."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch import data as D

CBCL_MAT = "/work/shared/data/cbcl_faces_train.mat"


@pytest.fixture(scope="module")
def cbcl_mat():
    if not os.path.exists(CBCL_MAT):
        pytest.skip(f"CBCL data not available at {CBCL_MAT}")
    return D.load_cbcl(CBCL_MAT)


# ----------------------------------------------------------------------------
# synthetic
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("L,M,K", [(30, 200, 5), (7, 3, 2), (1, 1, 1)])
def test_synthetic_shapes(L, M, K):
    d = D.synthetic(L=L, M=M, K=K)
    assert d.Z.shape == (L, M) and d.X.shape == (L, K) and d.Y.shape == (K, M)
    assert d.Z.dtype == torch.float64 and d.Z.device.type == "cpu"
    assert torch.all(d.X > 0) and torch.all(d.Y > 0)


def test_synthetic_deterministic():
    a, b = D.synthetic(seed=3), D.synthetic(seed=3)
    assert torch.equal(a.Z, b.Z) and torch.equal(a.X, b.X) and torch.equal(a.Y, b.Y)
    c = D.synthetic(seed=4)
    assert not torch.equal(a.X, c.X)
    assert not torch.equal(a.Z, c.Z)


def test_synthetic_default_draw_is_stable():
    # The draw order (X, then Y, then noise) is part of the contract: X does not
    # depend on M, and X, Y do not depend on the noise level.
    a = D.synthetic(seed=0)
    b = D.synthetic(seed=0, noise_var=0.0)
    assert torch.equal(a.X, b.X) and torch.equal(a.Y, b.Y)
    assert torch.equal(b.Z, b.X @ b.Y)
    c = D.synthetic(seed=0, M=50)
    assert torch.equal(a.X, c.X)


def test_synthetic_statistics():
    d = D.synthetic(L=400, M=400, K=50, seed=1)
    assert abs(d.X.mean().item() - 0.033) < 0.033 * 0.05
    assert abs(d.Y.mean().item() - 0.8) < 0.8 * 0.05
    # Exponential: standard deviation equals the mean.
    assert abs(d.X.std().item() - 0.033) < 0.033 * 0.08
    noise = d.Z - d.X @ d.Y
    assert abs(noise.mean().item()) < 3 * math.sqrt(3.6e-4 / noise.numel()) * 2
    assert abs(noise.var().item() - 3.6e-4) < 3.6e-4 * 0.03


def test_synthetic_paper_snr_about_20db():
    d = D.synthetic(seed=0)
    signal = d.X @ d.Y
    snr = 10 * math.log10(signal.pow(2).mean().item() / (d.Z - signal).pow(2).mean().item())
    assert 15 < snr < 25


def test_synthetic_float32_same_draws():
    a = D.synthetic(seed=5, dtype=torch.float64)
    b = D.synthetic(seed=5, dtype=torch.float32)
    s = D.synthetic(seed=5, dtype="float32")
    assert b.Z.dtype == torch.float32 and b.X.dtype == torch.float32
    assert torch.equal(b.Z, a.Z.float()) and torch.equal(b.X, a.X.float()) and torch.equal(b.Y, a.Y.float())
    assert torch.equal(s.Z, b.Z)


@pytest.mark.parametrize(
    "kw,match",
    [({"L": 0}, "L"), ({"K": 2.5}, "K"), ({"x_mean": 0}, "x_mean"), ({"y_mean": -1.0}, "y_mean"), ({"noise_var": -1e-3}, "noise_var"), ({"dtype": "int8"}, "dtype")],
)
def test_synthetic_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        D.synthetic(**kw)


# ----------------------------------------------------------------------------
# CBCL
# ----------------------------------------------------------------------------


def test_load_cbcl_mat(cbcl_mat):
    Z = cbcl_mat
    assert Z.shape == (361, 2429)
    assert Z.dtype == torch.float64
    assert Z.min().item() == 0.0 and Z.max().item() == 1.0
    # Values are k/255 for uint8 data.
    assert torch.allclose(Z * 255, (Z * 255).round())
    assert D.load_cbcl(CBCL_MAT, dtype=torch.float32).dtype == torch.float32


def test_cbcl_column_is_upright_face(cbcl_mat):
    # A face has its dark eye band above the lighter cheeks; in a transposed image
    # the left/right halves would be the ones that differ, so check rows.
    img = cbcl_mat[:, :200].mean(1).reshape(19, 19).T  # Fortran-order reshape
    eyes = img[5:8, 3:16].mean()
    cheeks = img[10:13, 3:16].mean()
    assert eyes < cheeks


@pytest.mark.parametrize("source", ["mat", "random"])
def test_load_cbcl_pgm_folder(tmp_path, source):
    Image = pytest.importorskip("PIL.Image")
    if source == "mat":
        if not os.path.exists(CBCL_MAT):
            pytest.skip(f"CBCL data not available at {CBCL_MAT}")
        import scipy.io

        cols = scipy.io.loadmat(CBCL_MAT)["X"][:, :5]
    else:
        cols = np.random.default_rng(0).integers(0, 256, size=(361, 4), dtype=np.uint8)
    for i in range(cols.shape[1]):
        img = cols[:, i].reshape(19, 19, order="F")
        Image.fromarray(np.ascontiguousarray(img)).save(tmp_path / f"face{i:05d}.pgm")
    (tmp_path / "README.txt").write_text("not an image")
    Z = D.load_cbcl(tmp_path)
    assert Z.shape == (361, cols.shape[1])
    assert torch.equal(Z, torch.from_numpy(cols.astype(np.float64) / 255))


def test_load_cbcl_pgm_16bit(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    img = (np.arange(361).reshape(19, 19) * 181).astype(np.uint16)
    Image.fromarray(img).save(tmp_path / "a.pgm")
    Z = D.load_cbcl(tmp_path)
    assert torch.allclose(Z[:, 0], torch.from_numpy(img.flatten(order="F") / 65535.0))


def test_load_cbcl_missing(tmp_path):
    p = tmp_path / "nowhere" / "faces.mat"
    with pytest.raises(DataError) as info:
        D.load_cbcl(p)
    msg = str(info.value)
    assert str(p) in msg and "MIT-CBCL" in msg and "data.path=" in msg


@pytest.mark.parametrize(
    "content,match",
    [
        ({"Y": np.zeros((361, 3), np.uint8)}, "no variable 'X'"),
        ({"X": np.zeros((360, 3), np.uint8)}, r"shape \(360, 3\)"),
        ({"X": np.zeros((361, 3, 2), np.uint8)}, "shape"),
    ],
)
def test_load_cbcl_bad_mat(tmp_path, content, match):
    import scipy.io

    p = tmp_path / "bad.mat"
    scipy.io.savemat(p, content)
    with pytest.raises(DataError, match=match):
        D.load_cbcl(p)


def test_load_cbcl_unreadable(tmp_path):
    p = tmp_path / "junk.mat"
    p.write_bytes(b"this is not a mat file at all" * 10)
    with pytest.raises(DataError, match="cannot read"):
        D.load_cbcl(p)
    d = tmp_path / "imgs"
    d.mkdir()
    with pytest.raises(DataError, match="no .pgm"):
        D.load_cbcl(d)
    Image = pytest.importorskip("PIL.Image")
    Image.fromarray(np.zeros((20, 19), np.uint8)).save(d / "big.pgm")
    with pytest.raises(DataError, match="19x19"):
        D.load_cbcl(d)


# ----------------------------------------------------------------------------
# npy / csv / dispatcher
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_npy_csv_round_trip(tmp_path, dtype):
    arr = np.random.default_rng(1).random((6, 4))
    np.save(tmp_path / "z.npy", arr)
    np.savetxt(tmp_path / "z.csv", arr, delimiter=",", fmt="%.17g")
    np.savetxt(tmp_path / "z.tsv", arr, delimiter="\t", fmt="%.17g")
    expected = torch.from_numpy(arr).to(dtype)
    assert torch.equal(D.load_npy(tmp_path / "z.npy", dtype), expected)
    assert torch.equal(D.load_csv(tmp_path / "z.csv", dtype), expected)
    assert torch.equal(D.load_csv(tmp_path / "z.tsv", dtype, delimiter="\t"), expected)
    assert torch.equal(D.load_matrix("npy", tmp_path / "z.npy", dtype=dtype), expected)
    assert torch.equal(D.load_matrix("csv", str(tmp_path / "z.tsv"), dtype=dtype, delimiter="\t"), expected)


def test_csv_single_column(tmp_path):
    (tmp_path / "c.csv").write_text("# header comment\n1\n2\n3\n")
    assert D.load_csv(tmp_path / "c.csv").shape == (3, 1)


@pytest.mark.parametrize(
    "writer,loader,match",
    [
        (lambda p: np.save(p, np.zeros(5)), D.load_npy, "2-D"),
        (lambda p: np.save(p, np.zeros((2, 3, 4))), D.load_npy, "2-D"),
        (lambda p: np.save(p, np.array([["a", "b"]])), D.load_npy, "real numbers"),
        (lambda p: np.save(p, np.array([[1.0, np.nan]])), D.load_npy, "finite"),
        (lambda p: np.save(p, np.array([[1, None]], dtype=object), allow_pickle=True), D.load_npy, "holds Python objects"),
        (lambda p: open(p, "w").write("1,2\n3,abc\n"), D.load_csv, "not a numeric matrix"),
        (lambda p: open(p, "w").write("1,2\n3\n"), D.load_csv, "not a numeric matrix"),
        (lambda p: open(p, "w").write("1,2\n3,inf\n"), D.load_csv, "finite"),
    ],
    ids=["npy_1d", "npy_3d", "npy_str", "npy_nan", "npy_object", "csv_text", "csv_ragged", "csv_inf"],
)
def test_npy_csv_errors(tmp_path, writer, loader, match):
    p = tmp_path / "bad.npy"
    writer(p)
    with pytest.raises(DataError, match=match):
        loader(p)


@pytest.mark.parametrize("loader", [D.load_npy, D.load_csv])
def test_npy_csv_missing(tmp_path, loader):
    p = tmp_path / "missing.file"
    with pytest.raises(DataError, match="not found") as info:
        loader(p)
    assert str(p) in str(info.value)


def test_load_matrix_dispatch(cbcl_mat):
    z = D.load_matrix("synthetic", seed=2, M=40)
    assert torch.equal(z, D.synthetic(seed=2, M=40).Z)
    assert D.load_matrix("synthetic", dtype="float32").dtype == torch.float32
    assert torch.equal(D.load_matrix("cbcl", CBCL_MAT), cbcl_mat)
    with pytest.raises(ConfigError, match="known kinds: synthetic, cbcl, npy, csv"):
        D.load_matrix("mnist")
    with pytest.raises(ConfigError, match="synthetic"):
        D.load_matrix("synthetic", bogus=1)
    with pytest.raises(ConfigError, match="unknown argument"):
        D.load_matrix("npy", "x.npy", delimiter=",")
    with pytest.raises(DataError, match="MIT-CBCL"):
        D.load_matrix("cbcl")


# ----------------------------------------------------------------------------
# split
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("M,N,lo,hi", [(200, 10, 4, 40), (2429, 10, 224, 245), (50, 7, None, None), (10, 10, 1, 1), (30, 3, 10, 10)])
@pytest.mark.parametrize("seed", [0, 1, 2, 99])
def test_split_counts_properties(M, N, lo, hi, seed):
    c = D.split_counts(M, N, lo, hi, seed=seed)
    assert len(c) == N and sum(c) == M
    assert all(isinstance(x, int) for x in c)
    lo_ = 1 if lo is None else lo
    hi_ = M if hi is None else hi
    assert all(lo_ <= x <= hi_ for x in c)
    assert c == D.split_counts(M, N, lo, hi, seed=seed)
    if lo is None:
        assert max(c) - min(c) <= 1
        assert c == sorted(c, reverse=True)


def test_split_counts_random_varies_with_seed():
    draws = {tuple(D.split_counts(200, 10, 4, 40, seed=s)) for s in range(10)}
    assert len(draws) == 10
    # Roughly uniform over [4, 40]: both small and large counts occur.
    pooled = [x for d in draws for x in d]
    assert min(pooled) < 12 and max(pooled) > 32


def test_split_counts_equal():
    assert D.split_counts(50, 7) == [8, 7, 7, 7, 7, 7, 7]
    assert D.split_counts(2429, 10) == [243] * 9 + [242]


@pytest.mark.parametrize(
    "args,match",
    [
        ((200, 10, 30, 40), "exceeds"),
        ((200, 10, 4, 15), "less than"),
        ((200, 10, 40, 4), "greater than"),
        ((200, 10, 0, 40), "lo"),
        ((5, 10, None, None), "at least one column"),
        ((5, 0, None, None), "n_agents"),
    ],
)
def test_split_counts_infeasible(args, match):
    with pytest.raises(ConfigError, match=match):
        D.split_counts(*args)


def test_split_columns():
    Z = torch.arange(3 * 10, dtype=torch.float64).reshape(3, 10)
    blocks = D.split_columns(Z, [4, 1, 5])
    assert [b.shape for b in blocks] == [(3, 4), (3, 1), (3, 5)]
    assert torch.equal(torch.cat(blocks, dim=1), Z)
    assert torch.equal(blocks[1], Z[:, 4:5])
    with pytest.raises(ConfigError, match="sum to 9 but Z has 10 columns"):
        D.split_columns(Z, [4, 5])
    with pytest.raises(ConfigError, match="at least 1"):
        D.split_columns(Z, [10, 0])
    with pytest.raises(DataError, match="2-D"):
        D.split_columns(Z[0], [10])


def test_ragged_csv_error_says_where_without_numpy_advice(tmp_path):
    f = tmp_path / "z.csv"
    f.write_text("1,2,3,4\n1,2,3\n")
    with pytest.raises(DataError, match=r"columns changed from 4 to 3 at row 2$") as err:
        D.load_csv(f)
    assert "usecols" not in str(err.value)
