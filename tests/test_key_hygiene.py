"""No private key's p or q, as decimal text, appears in any file a run writes."""
from __future__ import annotations

import warnings

import phe
import pytest

from ppdnmf_torch.config import from_dict
from ppdnmf_torch.exchange.paillier import InsecureKeyWarning, PaillierExchange
from ppdnmf_torch.exchange import IntegerCodec
from ppdnmf_torch.runner import run


@pytest.fixture
def recorded_keys(monkeypatch):
    """Every key pair the run generates, recorded on the side (the run never hands them out)."""
    made = []
    real = phe.generate_paillier_keypair

    def spy(*args, **kwargs):
        pk, sk = real(*args, **kwargs)
        made.append(sk)
        return pk, sk

    monkeypatch.setattr(phe, "generate_paillier_keypair", spy)
    return made


def _secrets(keys):
    out = set()
    for sk in keys:
        out |= {str(sk.p), str(sk.q), str(sk.p * sk.q - sk.p - sk.q + 1)}  # p, q and phi(n)
    return out


@pytest.mark.crypto
@pytest.mark.parametrize("protocol", ["aggregated", "paper"])
def test_run_outputs_hold_no_private_key(tmp_path, recorded_keys, protocol):
    cfg = from_dict({
        "n_agents": 4, "progress": False, "checkpoint_every": 1,
        "data": {"kind": "synthetic", "negative": "allow", "L": 6, "M": 16, "K": 2},
        "graph": {"kind": "ring"},
        "solver": {"rank": 2, "bcd_iters": 2, "x_iters": 2, "y_iters": 2},
        "exchange": {"kind": "paillier", "protocol": protocol, "n_max": 1e3, "key_bits": 128},
        "logger": {"kind": "tensorboard"},
    })
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(cfg, tmp_path / "run")
    assert any(issubclass(w.category, InsecureKeyWarning) for w in caught)
    assert len(recorded_keys) == 4  # one key pair per agent
    secrets = _secrets(recorded_keys)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"config.yaml", "factors.pt", "history.csv", "summary.json"} <= names
    assert any(p.parent.name == "checkpoints" for p in files)
    assert any("tfevents" in p.name for p in files)
    for f in files:
        data = f.read_bytes()
        for s in secrets:
            assert s.encode() not in data, f"{f} holds private key material"


@pytest.mark.crypto
def test_key_size_warning_and_default():
    with pytest.warns(InsecureKeyWarning, match="experiments only"):
        PaillierExchange(IntegerCodec(n_max=10, key_bits=512))
    with warnings.catch_warnings():
        warnings.simplefilter("error", InsecureKeyWarning)
        PaillierExchange(IntegerCodec(n_max=10))  # 2048 bits by default: no warning
    assert IntegerCodec().key_bits == 2048
