"""Run the FSSPCA experiments (ppdnmf_torch.models.fsspca.experiments) and write their numbers
(JSON) and figures (docs/figures/fsspca_*.png); docs/RESULTS.md reports them.

    python scripts/reproduce_fsspca.py --out runs/fsspca [--only support,workers] [--figures docs/figures]

``serverless`` is the study of :mod:`studies.fsspca_serverless` (scripts/studies/).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ppdnmf_torch.models.fsspca.experiments import EXPERIMENTS as LIBRARY, MAX_ITER  # noqa: E402
from studies.fsspca_serverless import serverless_table  # noqa: E402

#: the library's experiments and the serverless study (the server version against it, spiked model)
EXPERIMENTS = dict(LIBRARY, serverless=lambda: serverless_table(n_workers=8, alpha=200.0, seed=0, max_iter=MAX_ITER))


def _figures(results, fig_dir: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir.mkdir(parents=True, exist_ok=True)
    if "real_data" in results:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        rows = results["real_data"]
        for name in sorted({r["dataset"] for r in rows}):
            for split, ls in (("iid", "-"), ("class", "--")):
                pts = [(r["sparsity"], r["explained_variance"]) for r in rows if r["dataset"] == name
                       and r["split"] == split]
                if pts:
                    ax.plot(*zip(*pts), ls, marker="o", label=f"{name} ({split})")
        ax.set_xlabel("sparsity of z")
        ax.set_ylabel("adjusted explained variance")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(fig_dir / "fsspca_variance_sparsity.png", dpi=120)
        plt.close(fig)
    if "support" in results:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        rows = results["support"]
        for m in ("federated", "federated_pca_start", "centralized", "sklearn_sparsepca"):
            pts = [(r["sparsity"], r["f1"]) for r in rows if r["method"] == m]
            if pts:
                ax.plot(*zip(*sorted(pts)), marker="o", label=m)
        ax.set_xlabel("sparsity")
        ax.set_ylabel("support F1")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(fig_dir / "fsspca_support.png", dpi=120)
        plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/fsspca")
    p.add_argument("--only", default="", help="comma-separated experiment names: " + ",".join(EXPERIMENTS))
    p.add_argument("--figures", default="", help="write figures there (e.g. docs/figures), from every JSON in --out")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(EXPERIMENTS)
    if args.only == "none":
        names = []
    unknown = sorted(set(names) - set(EXPERIMENTS) - {"none"})
    if unknown:
        p.error(f"unknown experiments: {unknown}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in names:
        t0 = time.perf_counter()
        results[name] = EXPERIMENTS[name]()
        (out / f"{name}.json").write_text(json.dumps(results[name], indent=1))
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
    if args.figures:
        for f in out.glob("*.json"):  # earlier runs' numbers too
            results.setdefault(f.stem, json.loads(f.read_text()))
        _figures(results, Path(args.figures))


if __name__ == "__main__":
    main()
