#!/usr/bin/env bash
# Issue 48's GPU check of candidates="auto" (the two-level selection's c calibrated per layer once per prompt, from
# its last prefill chunk's queries, read by the kernels as data at the capacity c = 64), one GPU, one call per stage
# (each under 10 minutes). The tests stage also runs the tail estimate's kernels (issue 47) against their ops twins.
# usage (GPU machine, project root, vLLM 0.26 and this project on PYTHONPATH, e.g. after .gw/setup.sh):
#   bash samples/gpu_calibration.sh tests OUT     # kernel tests against the ops twins, the CUDA-graph replays (c
#                                                 # as data included), the backend's calibration and statistics
#   bash samples/gpu_calibration.sh kernels OUT   # one layer's decode step at GLM 1M, Llama 128K and 256K: flat,
#                                                 # each c static and as data at the capacity (~2 min)
#   bash samples/gpu_calibration.sh e2e OUT       # bench_e2e, Llama-3.1-8B shapes, 128K and 256K batch 1 and
#                                                 # BATCH (default 131072:3): candidates=auto (~5 min; FLASH_ATTN and
#                                                 # the flat scan: samples/gpu_selection_rows.sh flash|locks)
#   bash samples/gpu_calibration.sh all OUT       # tests then kernels
set -euo pipefail
STAGE=${1:?usage: gpu_calibration.sh tests|kernels|e2e|all OUT}
OUT=${2:?usage: gpu_calibration.sh tests|kernels|e2e|all OUT}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
tests() {
  python3 -m pytest -q tests/kernels/test_kernels_superpages.py tests/kernels/test_kernels_score_select.py \
    tests/kernels/test_kernels_graph.py tests/backend/test_vllm_backend_calibration.py \
    tests/backend/test_vllm_backend_two_level.py tests/backend/test_tail_backend.py tests/backend/test_device_stats.py tests/kernels/test_kernels_tail.py \
    2>&1 | tee "$OUT/tests.log" | tail -15
}
kernels() {
  python3 samples/bench_kernels.py --out "$OUT/kernels" --two-level 4,8,16,32,64 --live 64 --reps 15 2>&1 | tail -8
}
case "$STAGE" in
  tests) tests ;;
  kernels) kernels ;;
  all) tests; kernels ;;
  e2e)
    python3 samples/bench_e2e.py --shape llama3.1-8b --contexts 131072,262144 --batch "${BATCH-131072:3}" \
      --backends locks-2l --candidates auto --decode 32,160 --reps 3 --timeout 585 --total-s 590 \
      --time-limit 560 --out "$OUT/e2e" 2>&1 | tail -25 ;;
  *)
    echo "unknown stage $STAGE: tests, kernels, e2e or all"; exit 2 ;;
esac
