"""No private key's p, q or phi(n), and no mask seed of the masked protocol, appears in any file
a run writes: as decimal or hex text, or as raw bytes (big- or little-endian, as pickle,
torch.save and numpy store integers)."""
from __future__ import annotations

import warnings

import phe
import pytest

from ppdnmf_torch.models.ppdnmf.config import from_dict
from ppdnmf_torch.exchange.paillier import InsecureKeyWarning, PaillierExchange
from ppdnmf_torch.exchange import IntegerCodec
from ppdnmf_torch.app.runner import run


@pytest.fixture
def recorded_keys(monkeypatch):
    """Every key pair the run generates, recorded on the side (the run never hands them out)."""
    from ppdnmf_torch.exchange.paillier import keys

    made = []
    real = keys.generate_keypair

    def spy(*args, **kwargs):
        pk, sk = real(*args, **kwargs)
        made.append(sk)
        return pk, sk

    monkeypatch.setattr(keys, "generate_keypair", spy)
    return made


@pytest.fixture
def recorded_seeds(monkeypatch):
    """Every mask seed the run draws, recorded on the side (the seeds never leave their agents)."""
    from ppdnmf_torch.exchange.paillier import seeds

    made = []
    real = seeds._token

    def spy(k):
        s = real(k)
        made.append(s)
        return s

    monkeypatch.setattr(seeds, "_token", spy)
    return made


def _patterns(v: int) -> set:
    raw = v.to_bytes((v.bit_length() + 7) // 8, "big")
    return {str(v).encode(), format(v, "x").encode(), format(v, "X").encode(), raw, raw[::-1]}


def _secrets(keys, seeds=()):
    """Byte patterns of every key's p, q and phi(n), and of every seed (its bytes, as an
    integer, and the chunks it is encrypted in)."""
    from ppdnmf_torch.exchange.paillier.seeds import seed_to_chunks

    out = set()
    for sk in keys:
        for v in (sk.p, sk.q, sk.p * sk.q - sk.p - sk.q + 1):
            out |= _patterns(v)
    for s in seeds:
        out |= {s, s[::-1], s.hex().encode()} | _patterns(int.from_bytes(s, "big"))
        out |= {p for c in seed_to_chunks(s, 128) if c.bit_length() > 64 for p in _patterns(c)}
    return out


def test_the_scan_finds_keys_stored_as_bytes(tmp_path):
    # the scan itself: a pickled integer (binary, little-endian) and a hex dump are caught
    import pickle

    sk = phe.generate_paillier_keypair(n_length=128)[1]
    pats = _secrets([sk])
    for blob in (pickle.dumps(sk.p), pickle.dumps(sk.q, protocol=0), format(sk.q, "x").encode(),
                 str(sk.p).encode()):
        assert any(pat in blob for pat in pats)


@pytest.mark.crypto
@pytest.mark.parametrize("protocol", ["masked", "aggregated", "paper"])
def test_run_outputs_hold_no_private_key(tmp_path, recorded_keys, recorded_seeds, protocol):
    cfg = from_dict({
        "n_agents": 4, "progress": False, "checkpoint_every": 1, "keep_checkpoints": True,
        "data": {"kind": "synthetic", "negative": "allow", "L": 6, "M": 16, "K": 2},
        "graph": {"kind": "ring"},
        "solver": {"rank": 2, "bcd_iters": 2, "x_iters": 2, "y_iters": 2},
        "exchange": {"kind": "paillier", "protocol": protocol, "n_max": 1e3, "key_bits": 128},
        "logger": {"kind": "tensorboard"},
    })
    from ppdnmf_torch.exchange.paillier import calibration

    calibration._CACHE.clear()  # the estimate before the run calibrates here, its keys and seeds recorded too
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(cfg, tmp_path / "run")
    assert any(issubclass(w.category, InsecureKeyWarning) for w in caught)
    # one key pair per agent (the run's), and the calibration's before it (calibration.KEYGENS, on a
    # triangle of agents whose exchange is timed and closed: exchange/paillier/calibration.py)
    assert len(recorded_keys) == 4 + calibration.KEYGENS
    # masked: a seed per pair of neighbours of each agent (4 on the ring) and per edge (4), and the
    # calibration triangle's (3 and 3)
    assert len(recorded_seeds) == (8 + 6 if protocol == "masked" else 0)
    secrets = _secrets(recorded_keys, recorded_seeds)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"config.yaml", "factors.pt", "history.csv", "summary.json"} <= names
    assert any(p.parent.name == "checkpoints" for p in files)
    assert any("tfevents" in p.name for p in files)
    for f in files:
        data = f.read_bytes()
        for s in secrets:
            assert s not in data, f"{f} holds private key material"


@pytest.mark.crypto
def test_key_size_warning_and_default():
    with pytest.warns(InsecureKeyWarning, match="experiments only"):
        PaillierExchange(IntegerCodec(n_max=10, key_bits=512))
    with warnings.catch_warnings():
        warnings.simplefilter("error", InsecureKeyWarning)
        PaillierExchange(IntegerCodec(n_max=10))  # 2048 bits by default: no warning
    assert IntegerCodec().key_bits == 2048


@pytest.mark.crypto
@pytest.mark.parametrize("bad", ["junk", 0, "n_squared"])
def test_malformed_ciphertext_leaves_no_secret_in_traceback_locals(bad):
    # loggers and debuggers that show a traceback's locals must not find p or q there
    from ppdnmf_torch.exchange.paillier.obfuscation import PrivateCRT

    pk, sk = phe.generate_paillier_keypair(n_length=128)
    crt = PrivateCRT(sk)
    if bad == "n_squared":
        bad = pk.nsquare
    with pytest.raises((ValueError, TypeError)) as err:
        crt.decrypt([bad])
    secret = {int(sk.p), int(sk.q)}
    tb = err.value.__traceback__
    while tb is not None:
        for name, value in tb.tb_frame.f_locals.items():
            try:
                assert int(value) not in secret, f"{name} holds a prime factor"
            except (TypeError, ValueError):
                pass
        tb = tb.tb_next


@pytest.fixture
def recorded_secagg(monkeypatch):
    """Every private key (identity and ephemeral, raw bytes) and every seed that an
    exchange="secagg" run makes, recorded on the side (they never leave their parties)."""
    from ppdnmf_torch.exchange.secagg import party

    made = {"keys": [], "seeds": []}
    real_id, real_eph, real_seed = party._new_identity, party._new_ephemeral, party._derive_seed

    def ident():
        k = real_id()
        made["keys"].append(k.private_bytes_raw())
        return k

    def eph():
        k = real_eph()
        made["keys"].append(k.private_bytes_raw())
        return k

    def seed(shared, info):
        s = real_seed(shared, info)
        made["seeds"].append(s)
        made["keys"].append(shared)  # the Diffie-Hellman secret, too
        return s

    monkeypatch.setattr(party, "_new_identity", ident)
    monkeypatch.setattr(party, "_new_ephemeral", eph)
    monkeypatch.setattr(party, "_derive_seed", seed)
    return made


def test_secagg_run_outputs_hold_no_key_or_seed(tmp_path, recorded_secagg):
    # a checkpointed, resumed-from-nothing CLI run with TensorBoard: no private key, Diffie-Hellman
    # secret or seed in any file; the masked protocol's costs are in TensorBoard as Paillier's are
    from tensorboard.backend.event_processing import event_accumulator

    cfg = from_dict({
        "n_agents": 4, "progress": False, "checkpoint_every": 1, "keep_checkpoints": True,
        "data": {"kind": "synthetic", "negative": "allow", "L": 6, "M": 16, "K": 2},
        "graph": {"kind": "ring"},
        "solver": {"rank": 2, "bcd_iters": 2, "x_iters": 2, "y_iters": 2},
        "exchange": {"kind": "secagg", "n_max": 1e3},
        "logger": {"kind": "tensorboard"},
    })
    summary = run(cfg, tmp_path / "run")
    assert len(recorded_secagg["keys"]) > 8 and len(recorded_secagg["seeds"]) == 16  # 4 pair + 4 edge, twice
    secrets = set()
    for s in recorded_secagg["keys"] + recorded_secagg["seeds"]:
        secrets |= {s, s[::-1], s.hex().encode()} | _patterns(int.from_bytes(s, "big"))
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.parent.name == "checkpoints" for p in files) and any("tfevents" in p.name for p in files)
    for f in files:
        data = f.read_bytes()
        for s in secrets:
            assert s not in data, f"{f} holds secagg key material"
    # one Diffie-Hellman per party and peer: its two neighbours and the agent opposite on the ring
    assert summary["costs"]["messages"] > 0 and summary["costs"]["setup_key_agreements"] == 12
    acc = event_accumulator.EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"crypto/messages", "crypto/message_bytes", "crypto/prg_bytes", "crypto/time_mask",
            "crypto/setup_key_agreements", "crypto/setup_bytes", "crypto/time_setup",
            "crypto_admm/messages", "crypto_admm/time_mask"} <= tags
    assert not any(t.startswith("crypto_admm/setup") for t in tags)
