#!/usr/bin/env bash
# Issue 27's target table on one GPU, one stage a call (each under 10 minutes), all stages on one machine: the
# two-level selection with the evaluation model's keep-needle table stretched to the dummy shape's depth
# (locks_bench.candidates.stretch), the flat scan and vLLM's FLASH_ATTN, budget 2048, r = 8, CUDA graphs.
# usage (GPU machine, project root, vLLM 0.26 and this project on PYTHONPATH, e.g. after .gw/setup.sh):
#   bash samples/gpu_selection_rows.sh flash OUT      # FLASH_ATTN: 128K and 256K at batch 1, 128K x 6 (cold: ~7 min)
#   bash samples/gpu_selection_rows.sh locks-2l OUT   # the two-level selection, the same cells (~5 min)
#   bash samples/gpu_selection_rows.sh locks OUT      # the flat scan, the same cells (~5 min)
#   bash samples/gpu_selection_rows.sh kernels OUT    # one layer's decode step at GLM 1M, Llama 128K and 256K: the
#                                                     # flat scan, each c of the table, its mean, vLLM's FA3 (~3 min)
#   python samples/selection_rows.py --e2e OUT/e2e --kernels OUT/kernels/two_level.json --json OUT/targets.json
# 128K x 6 sequences needs about 135 GiB of GPU memory (99 GiB of KV): an H200; BATCH= (empty) leaves it out.
set -euo pipefail
STAGE=${1:?usage: gpu_selection_rows.sh flash|locks-2l|locks|kernels OUT}
OUT=${2:?usage: gpu_selection_rows.sh flash|locks-2l|locks|kernels OUT}
TABLE=${TABLE:-keep-needle}
BATCH=${BATCH-131072:6}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
case "$STAGE" in
  flash|locks|locks-2l)
    # a cold first engine (JIT caches) takes ~4 minutes to start: the limits leave it room
    python3 samples/bench_e2e.py --shape llama3.1-8b --contexts 131072,262144 ${BATCH:+--batch "$BATCH"} \
      --backends "$STAGE" --candidates "$TABLE" --decode 32,160 --reps 3 \
      --timeout 585 --total-s 590 --time-limit 560 --out "$OUT/e2e" 2>&1 | tail -25 ;;
  kernels)
    python3 samples/bench_kernels.py --out "$OUT/kernels" --two-level 4 --table "$TABLE" --reps 15 2>&1 | tail -8 ;;
  *)
    echo "unknown stage $STAGE: flash, locks-2l, locks or kernels"; exit 2 ;;
esac
