#!/usr/bin/env bash
# Reproduce Sec. IV / Fig. 1 of the PPDNMF paper (arXiv 2403.18326).
# Outputs go to outputs/paper/<timestamp>/ (or --out DIR); the PNGs are copied to docs/figures/.
#
#   scripts/reproduce_paper.sh                       # the paper's setting: 100 + 100 trials (long on a CPU)
#   scripts/reproduce_paper.sh --trials-cbcl 4 --threads 1 --paillier-trials 2   # what docs/RESULTS.md records
#   scripts/reproduce_paper.sh --skip-cbcl --trials 10
#
# Every argument is passed on to scripts/reproduce_paper.py (see --help).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python scripts/reproduce_paper.py "$@"
