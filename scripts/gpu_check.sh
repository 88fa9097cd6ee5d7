#!/usr/bin/env bash
# One short call on a CUDA machine: both benchmarks and the GPU tests, results under $OUT (or outputs/gpu_check).
# Usage: bash scripts/gpu_check.sh            (expects torch with CUDA and the package importable)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-outputs/gpu_check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" | tee -a "$out/gpu.txt"
# the gpu-marked tests (device fixture over cuda)
timeout 300 python -m pytest -q -m "gpu" -p no:cacheprovider 2>&1 | tail -5 | tee "$out/gpu_tests.txt"
# solver: loop vs batched at N up to 10,000 agents, roofline at N = 2000 (CBCL sizes), 100 trials;
# the eager solver only (fuse=True would compile a Triton kernel set per shape: minutes)
timeout 420 python scripts/bench_solver.py --device cuda --ns 10 100 1000 10000 --roofline-n 2000 --trials 100 \
    --ref-trials 1 --modes eager --json "$out/bench_solver_cuda.json" 2>&1 | tee "$out/bench_solver_cuda.txt"
# the host-side Paillier stage (CPU cores of the GPU machine)
timeout 300 python scripts/bench_crypto.py --json "$out/bench_crypto.json" 2>&1 | tee "$out/bench_crypto.txt"
