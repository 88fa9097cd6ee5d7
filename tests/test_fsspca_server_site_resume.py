"""FSSPCA with a server in site mode, checkpoints per site (``<checkpoint_dir>/rank<r>/``): a run
whose worker site is killed mid-run, resumed by every site from its own checkpoints (new mask
seeds under secagg), gives the uninterrupted run's z, w, u and history bit for bit (the masked
sums are exact in the integer ring: the masks do not change a total)."""
from __future__ import annotations

import os

import pytest
import torch

from ppdnmf_torch.distributed import launch_local

from test_fsspca_server_site import D, OPTIONS, SHORT, _own

LONG = dict(SHORT, max_iter=6)
KILL_AT = 4


def _killed(folder):
    """Every site with checkpoints after each iteration; site 2 dies in its callback of iteration KILL_AT
    (the driver writes that iteration's checkpoint first: the resumed run starts after it or before)."""
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.fsspca.server_site import fit_fsspca_server_site

    r = int(os.environ["RANK"])

    def die(k, row):
        if r == 2 and k == KILL_AT:
            os._exit(3)
        return False

    with Comm.connect("env://", timeout=60, heartbeat=None) as comm:
        fit_fsspca_server_site(comm, _own(r), 2, n_features=D, exchange="secagg", exchange_options=OPTIONS["secagg"],
                               checkpoint_dir=folder, checkpoint_every=1, callback=die, **LONG)


def _resumed(folder):
    """The uninterrupted run, then every site resumed from its own checkpoints."""
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.fsspca.server_site import fit_fsspca_server_site

    r, seen = int(os.environ["RANK"]), []
    kw = dict(n_features=D, exchange="secagg", exchange_options=OPTIONS["secagg"], **LONG)
    with Comm.connect("env://", timeout=120) as comm:
        whole = fit_fsspca_server_site(comm, _own(r), 2, **kw)
        again = fit_fsspca_server_site(comm, _own(r), 2, checkpoint_dir=folder, checkpoint_every=1, resume=True,
                                       callback=lambda k, row: seen.append(k), **kw)
    return {"whole": whole, "again": again, "seen": seen}


@pytest.mark.slow
@pytest.mark.crypto
def test_a_killed_site_run_resumed_gives_the_uninterrupted_z(tmp_path):
    outs = launch_local(3, _killed, (str(tmp_path),), timeout=300, grace=5)
    assert outs[2].exitcode == 3 and all(o.exitcode != 0 for o in outs), [o.error for o in outs]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partition.json", "rank000", "rank001", "rank002"]
    outs = launch_local(3, _resumed, (str(tmp_path),), timeout=300)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    for r, o in enumerate(outs):
        whole, again = o.value["whole"], o.value["again"]
        assert 1 < o.value["seen"][0] <= KILL_AT + 1 and o.value["seen"][-1] == LONG["max_iter"], o.value["seen"]
        assert again.n_iter == whole.n_iter == LONG["max_iter"]
        assert torch.equal(again.z, whole.z), r
        for name in ("w", "u"):
            assert torch.equal(again.own[name], whole.own[name]), (r, name)
        for key, v in whole.history.items():
            assert torch.equal(again.history[key], v), (r, key)
