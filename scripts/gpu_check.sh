#!/usr/bin/env bash
# One short call on a CUDA machine: the GPU tests, the benchmarks and a distributed run, results under $OUT
# (or outputs/gpu_check). Sized to end within 8 minutes: each step has its own time limit,
# and a step that runs out leaves what it printed in its log.
#
#   bash scripts/gpu_check.sh                       # on a CUDA machine
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_QUICK=1 bash scripts/gpu_check.sh   # dry run of the script here
#
# A machine without some of this package's dependencies (phe, gmpy2, hydra-core, omegaconf,
# antlr4-python3-runtime) takes them as wheels from .whl/ (git-ignored), installed into
# /tmp/site for the call; docs/PERFORMANCE.md ("No GPU was lent") gives the download commands.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-outputs/gpu_check}"
dev="${GPU_CHECK_DEVICE:-cuda}"
quick="${GPU_CHECK_QUICK:-0}"
py="$(command -v python3 || command -v python)"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import phe, gmpy2, hydra, omegaconf" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_check: installing the wheels in .whl/ failed" | tee "$out/gpu.txt"; exit 1; }
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
{
    date -u
    if [ "$dev" = cuda ]; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; fi
    "$py" -c "import torch, os; print('torch', torch.__version__, 'cuda', torch.version.cuda,
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device', 'cpus', os.cpu_count())"
} 2>&1 | tee "$out/gpu.txt"
if [ "$quick" = 1 ]; then
    ns=(10 100); trials=10; tests="tests/test_solver.py"
    solver_extra=(--quick --skip-loop)
    crypto=(--bits 128 --iters 1 --fit-bcd 0)
    symnmf=(--quick --ns 60 120 --numpy-max-n 60 --sparse-ns 2000)
    fsspca_grid=(--sizes 200:10:1,200:10:4 --repeats 1)
    one_trial=(--quick)
else
    ns=(10 100 1000 10000); trials=100; tests=""
    # the loop up to N = 1000 (at N = 10,000 with CBCL sizes it alone would take minutes)
    solver_extra=(--roofline-n 2000 --ref-trials 1 --loop-max-n 1000)
    crypto=(--bits 128 1024 2048 --max-seconds 5 --fit-bcd 0)
    # the numpy side (on the host) only at n = 300: at n = 5000 with 20 trials it alone takes minutes
    symnmf=(--ns 300 1000 5000 --numpy-max-n 300 --grid-iters 2 --repeats 1 --sparse-ns 50000)
    # issue 41: FSSPCA's polar step on the device against the NumPy ADMM on the host (time to the same support)
    fsspca_grid=(--sizes 1000:40:1,1000:40:10,10000:40:100 --repeats 1)
    # issue 41: one trial of SymHALS (two calls per column, round 5) and SymANLS on the device
    # against numpy on the host, at the issue's three sizes
    one_trial=(--ns 150 1000 3000 --ranks 6 20 40 --repeats 1)
fi
# 1. the tests on the device (the gpu-marked ones, and every device-parametrized test)
if [ "$dev" = cuda ]; then sel=(-m gpu); else sel=(-x); fi
timeout 90 "$py" -m pytest -q -p no:cacheprovider "${sel[@]}" $tests 2>&1 | tail -5 | tee "$out/gpu_tests.txt"
# 2. the solver: loop vs batched at N up to 10,000 agents, the roofline at N = 2000 (CBCL
# sizes), 100 trials; eager only (fuse=True compiles a Triton kernel set per shape: minutes)
timeout 110 "$py" scripts/bench_solver.py --device "$dev" --ns "${ns[@]}" --trials "$trials" --modes eager \
    "${solver_extra[@]}" --json "$out/bench_solver.json" 2>&1 | tee "$out/bench_solver.txt"
# 3. the host-side Paillier stage, on that machine's CPU cores (its worker pool uses them all)
timeout 70 "$py" scripts/bench_crypto.py "${crypto[@]}" --json "$out/bench_crypto.json" 2>&1 \
    | tee "$out/bench_crypto.txt"
# 4. several ranks: the distributed run against one process (bits, seconds, bytes per rank);
# on every GPU (NCCL) of a machine with two or more, else on two gloo ranks on the CPU
ngpu=0
if [ "$dev" = cuda ]; then ngpu="$("$py" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)"; fi
if [ "$ngpu" -ge 2 ]; then dist_dev=cuda; nranks="$ngpu"; else dist_dev=cpu; nranks=2; fi
if [ "$quick" = 1 ]; then dist_size=(--n-agents 12 --bcd 2 --x-iters 3 --y-iters 3); else dist_size=(--n-agents 100 --bcd 3 --x-iters 5 --y-iters 5); fi
# (paillier with small keys: its protocol split over the ranks, on their hosts' cores)
timeout 60 "$py" scripts/bench_distributed.py --device "$dist_dev" --nproc 1 "$nranks" "${dist_size[@]}" \
    --kinds plain quantized paillier --key-bits 128 \
    --json "$out/bench_distributed.json" 2>&1 | tee "$out/bench_distributed.txt"
# 5. FSSPCA: the batched workers on the device against the NumPy loop over workers (K = 10 to 1000)
timeout 35 "$py" scripts/bench_fsspca.py --device "$dev" --part loop --Ks 10,100,1000 --iters 5 --repeats 1 --skip-sklearn \
    --json "$out/bench_fsspca.json" 2>&1 | tee "$out/bench_fsspca.txt"
# 6. symmetric NMF: the sparse path at n = 50,000 (SymHALS, 50 iterations), then the batched SymHALS and
# SymANLS on the device at n up to 5000, r = 20, 40, one and 20 trials (against numpy on the host at n = 300)
timeout 55 "$py" scripts/bench_symnmf.py --device "$dev" --part sparse numpy "${symnmf[@]}" \
    --json "$out/bench_symnmf.json" 2>&1 | tee "$out/bench_symnmf.txt"
# 7. FSSPCA's polar local step (issue 41): the library on the device, the NumPy ADMM on the host, each to
# the same support; the paper's Riemannian steps and scikit-learn left out (their rows are the CPU grid's)
timeout 20 "$py" scripts/bench_fsspca.py --device "$dev" --part grid "${fsspca_grid[@]}" --riemannian-max-k 0 \
    --sklearn-max-nd 0 --json "$out/bench_fsspca_grid.json" 2>&1 | tee "$out/bench_fsspca_grid.txt"
# 8. one trial of SymHALS and SymANLS (issue 41): the solver's torch plan on the device (the host plan
# is the CPU's: fit_symnmf(plan="auto") picks the torch plan on CUDA), numpy on the host
timeout 20 "$py" scripts/bench_symnmf.py --device "$dev" --part one-trial "${one_trial[@]}" \
    --json "$out/bench_symnmf_one_trial.json" 2>&1 | tee "$out/bench_symnmf_one_trial.txt"
# 9. the CPU's host plans (issue 41, round 7: fit_symnmf's and fit_fsspca's plan="auto" on CPU tensors)
# on that machine's CPU, one thread, against numpy on the same thread: another CPU than the development one
host_plans="$(printf '%q ' "$py" scripts/bench_symnmf.py --device cpu --part one-trial "${one_trial[@]}" \
    --json "$out/bench_symnmf_one_trial_cpu.json"); $(printf '%q ' "$py" scripts/bench_fsspca.py --device cpu \
    --part grid --sizes 1000:40:1,1000:40:10 --repeats 1 --riemannian-max-k 0 --sklearn-max-nd 0 \
    --json "$out/bench_fsspca_grid_cpu.json")"
OMP_NUM_THREADS=1 timeout 20 bash -c "$host_plans" 2>&1 | tee "$out/bench_host_plans_cpu.txt"
echo "gpu_check: done; logs in $out" | tee -a "$out/gpu.txt"
