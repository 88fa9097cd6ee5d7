"""FSSPCA with a server in site mode (issue 39, :mod:`ppdnmf_torch.models.fsspca.server_site`):
site 0 the server (no data), sites 1..K the workers with their own rows only; z is fit_server_rank's
bits (the same sums in the same order) and fit_fsspca's to the server-over-ranks tests' tolerance;
under secagg no site sends or writes a worker's rows or its uploads ``w_i + u_i / rho``; a killed
run resumed from its per-site checkpoints gives the uninterrupted run's z."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ppdnmf_torch.distributed import launch_local
from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch.models.fsspca import fit_fsspca
from ppdnmf_torch.models.fsspca.server_site import fit_fsspca_server_site

ROWS, D = [7, 9], 6
SHORT = dict(max_iter=5, seed=4, alpha=0.05, tol=0.0)
OPTIONS = {"plain": None, "secagg": {"n_max": 1e7}}


def _blocks():
    rng = np.random.default_rng(3)
    basis = rng.standard_normal((2, D))
    return [torch.from_numpy(rng.standard_normal((n, 2)) @ basis + 0.3 * rng.standard_normal((n, D)) + 1.0)
            for n in ROWS]


def _own(r):
    return None if r == 0 else _blocks()[r - 1]


def _site(kind, folder):
    """Site ``RANK``: fit_server_rank, then the site run on the same transport; the uploads the
    site's workers compute are recorded on the side (admm.upload wrapped) for the scan."""
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.fsspca import admm
    from ppdnmf_torch.models.fsspca.server_ranks import fit_server_rank

    r = int(os.environ["RANK"])
    uploads, upload = [], admm.upload

    def record(*args, **kw):
        out = upload(*args, **kw)
        uploads.append(out.detach().clone())
        return out

    admm.upload = record
    ckpt = None if folder is None else os.path.join(folder, f"site{r}")
    with Comm.connect("env://", timeout=120, record=True) as comm:
        ref = fit_server_rank(comm, None if r == 0 else [_own(r)], 2, n_workers=len(ROWS), n_features=D,
                              assignment=[1, 2], exchange=kind, exchange_options=OPTIONS[kind], **SHORT)
        start, uploads[:] = len(comm.sent_log), []
        out = fit_fsspca_server_site(comm, _own(r), 2, n_features=D, exchange=kind, exchange_options=OPTIONS[kind],
                                     checkpoint_dir=ckpt, checkpoint_every=1, **SHORT)
        log = b"".join(m for _, _, m in comm.sent_log[start:])
    return {"z": out.z, "ref_z": ref.z, "own": out.own, "history": out.history, "log": log, "uploads": uploads}


def _pieces(r, uploads) -> list:
    """Worker site ``r``'s values as they would appear on the wire: every entry of its rows as
    float64, every pair of neighbouring entries as float32, every pair of its nonzero upload
    entries as float64."""
    X = _own(r)
    out = [bytes(v.numpy().tobytes()) for v in X.reshape(-1)]
    x32 = X.to(torch.float32)
    out += [x32[a, b:b + 2].numpy().tobytes() for a in range(x32.shape[0]) for b in range(x32.shape[1] - 1)]
    for t in uploads:
        flat = t[t != 0].reshape(-1)
        out += [flat[j:j + 2].numpy().tobytes() for j in range(0, flat.numel() - 1, 2)]
    return out


def _files(folder) -> bytes:
    return b"".join(p.read_bytes() for p in Path(folder).rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("kind, tol", [("plain", 1e-10), pytest.param("secagg", 1e-6, marks=pytest.mark.crypto)])
def test_a_server_site_and_two_worker_sites_give_fit_server_ranks_z(kind, tol, tmp_path):
    outs = launch_local(3, _site, (kind, str(tmp_path)), timeout=600, grace=60)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    ref = fit_fsspca(_blocks(), 2, aggregation="plain", **SHORT)
    for r, o in enumerate(outs):
        # the same sums in the same order as fit_server_rank's (the masks cancel exactly in the ring)
        assert torch.equal(o.value["z"], o.value["ref_z"]), r
        assert torch.allclose(o.value["z"], ref.z[0], rtol=0, atol=tol), (r, (o.value["z"] - ref.z[0]).abs().max())
        assert torch.allclose(o.value["history"]["primal_residual"], ref.history["primal_residual"][:, 0],
                              rtol=1e-6 if kind == "secagg" else 1e-9)
    assert outs[0].value["own"]["workers"] == [] and outs[2].value["own"]["workers"] == [1]
    assert torch.allclose(outs[1].value["own"]["w"], ref.w[0, :1], rtol=0, atol=tol)
    for r in (1, 2):
        other = set(_pieces(3 - r, outs[3 - r].value["uploads"]))
        pieces = [p for p in _pieces(r, outs[r].value["uploads"]) if p not in other]
        assert len(pieces) > 100
        found = [s for s, o in enumerate(outs) if s != r and any(p in o.value["log"] for p in pieces)]
        if kind == "plain":  # the scan finds the uploads where they cross in the clear: at the server's site
            assert any(p in outs[r].value["log"] for p in pieces), "the scan finds nothing even in the clear"
            continue
        assert not [p for p in pieces if p in outs[r].value["log"]], f"site {r} sent its rows or uploads"
        assert not found, f"sites {found} sent site {r}'s values"
        for s in range(3):
            if s != r:
                files = _files(tmp_path / f"site{s}")
                assert files and not [p for p in pieces if p in files], f"site {s} wrote site {r}'s values"
        w = outs[r].value["own"]["w"].reshape(-1)
        assert any(w[j:j + 2].numpy().tobytes() in _files(tmp_path / f"site{r}") for j in range(0, w.numel() - 1, 2))


class _Mute:
    """A site of a 3-site run that must not send: every collective fails the test."""

    def __init__(self, rank):
        from ppdnmf_torch.distributed.comm import Comm

        self.comm = object.__new__(type("MuteComm", (Comm,), {
            name: (lambda *a, **k: pytest.fail("a message before the refusal"))
            for name in ("all_gather_object", "all_gather", "all_reduce", "broadcast", "broadcast_object")}))
        self.comm.rank, self.comm.world_size, self.comm.device = rank, 3, torch.device("cpu")


def test_a_site_refuses_wrong_rows_and_sites_before_any_message():
    with pytest.raises(DataError, match="public description has"):
        fit_fsspca_server_site(_Mute(1).comm, torch.zeros((4, D + 1), dtype=torch.float64), 2, n_features=D)
    with pytest.raises(DataError, match="server"):
        fit_fsspca_server_site(_Mute(0).comm, _own(1), 2, n_features=D)
    with pytest.raises(ConfigError, match="n_workers") as err:
        fit_fsspca_server_site(_Mute(1).comm, _own(1), 2, n_features=D, n_workers=3)
    assert err.value.key == "n_workers"
    with pytest.raises(ConfigError, match="holds no worker"):
        fit_fsspca_server_site(_Mute(1).comm, _own(1), 2, n_features=D, assignment=[1, 1])
