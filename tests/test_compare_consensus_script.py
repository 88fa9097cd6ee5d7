"""scripts/compare_consensus.py --quick runs end to end (slow: two setups, five methods, both audits)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_comparison_writes_its_tables(tmp_path, cbcl_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_consensus.py"), "--quick", "--threads", "1",
                        "--out", str(tmp_path), "--cbcl", str(cbcl_path)], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads((tmp_path / "results.json").read_text())
    for setup in ("synthetic", "cbcl"):
        rows = {row["method"]: row for row in rep["comparison"][setup]}
        assert set(rows) == {"admm/plain", "admm/paillier", "i_admm", "pi_admm", "pi_admm2"}
        # the integer protocol quantizes at N_max = 1e6: close to the float exchange, not equal
        assert rows["admm/paillier"]["nmse"] == pytest.approx(rows["admm/plain"]["nmse"], rel=1e-3)
        assert rows["admm/paillier"]["est_paillier_s"] > 0 and rows["pi_admm"]["est_paillier_s"] is None
        assert rows["pi_admm"]["vectors"] < rows["admm/plain"]["vectors"]
    inc = rep["privacy"]["incremental"]["paper_synthetic"]
    assert inc["pi_admm"]["eavesdropper"]["offsets_u"]["exact"] == 10
    assert "| pi_admm |" in (tmp_path / "results.md").read_text()
