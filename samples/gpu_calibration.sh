#!/usr/bin/env bash
# Issue 48's GPU check of candidates="auto" (the two-level selection's c calibrated per layer from the prompt's last
# queries, read by the kernels as data at the capacity c = 32), one GPU, one call per stage (each under 10 minutes).
# usage (GPU machine, project root, vLLM 0.26 and this project on PYTHONPATH, e.g. after .gw/setup.sh):
#   bash samples/gpu_calibration.sh tests OUT     # kernel tests against the ops twins, the CUDA-graph replays (c
#                                                 # as data included), the backend's calibration (~4 min)
#   bash samples/gpu_calibration.sh kernels OUT   # one layer's decode step at GLM 1M, Llama 128K and 256K: flat,
#                                                 # each c static and as data at the capacity (~4 min)
#   bash samples/gpu_calibration.sh e2e OUT       # bench_e2e, Llama-3.1-8B shapes, 128K batch 1: the two-level
#                                                 # selection with candidates=auto against the flat scan (~8 min)
#   bash samples/gpu_calibration.sh all OUT       # tests then kernels
set -euo pipefail
STAGE=${1:?usage: gpu_calibration.sh tests|kernels|e2e|all OUT}
OUT=${2:?usage: gpu_calibration.sh tests|kernels|e2e|all OUT}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
tests() {
  python3 -m pytest -q tests/kernels/test_kernels_superpages.py tests/kernels/test_kernels_score_select.py \
    tests/kernels/test_kernels_graph.py tests/backend/test_vllm_backend_calibration.py \
    tests/backend/test_vllm_backend_two_level.py 2>&1 | tee "$OUT/tests.log" | tail -15
}
kernels() {
  python3 samples/bench_kernels.py --out "$OUT/kernels" --two-level 4,8,16,32 --live 32 --reps 15 2>&1 | tail -8
}
case "$STAGE" in
  tests) tests ;;
  kernels) kernels ;;
  all) tests; kernels ;;
  e2e)
    python3 samples/bench_e2e.py --shape llama3.1-8b --contexts 131072 --backends locks-2l,locks \
      --candidates auto --decode 32,160 --reps 3 --timeout 585 --total-s 590 --time-limit 560 \
      --out "$OUT/e2e" 2>&1 | tail -25 ;;
  *)
    echo "unknown stage $STAGE: tests, kernels, e2e or all"; exit 2 ;;
esac
