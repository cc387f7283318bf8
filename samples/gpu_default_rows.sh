#!/usr/bin/env bash
# Issue 48's table for the default selection (two-level, candidates="auto") in one lease, one stage a call (each
# under 10 minutes of the call's limit), every stage on one machine, in the order below (~26 minutes in all with a
# cold first engine; flat and tail come last, for what device time is left):
#   bash samples/gpu_default_rows.sh glm-flash OUT     # FLASH_ATTN, GLM-4-9B-1M-like at 1M, 2 and 8 layers,
#                                                      # profiled (cold JIT caches: ~7.5 min; warm ~6.5)
#   bash samples/gpu_default_rows.sh glm-default OUT   # the default, the same cells (~5.5 min)
#   bash samples/gpu_default_rows.sh flash OUT         # FLASH_ATTN, Llama-3.1-8B shapes: 128K and 256K batch 1 and
#                                                      # BATCH (default 131072:3, an H100's; 131072:6 on an H200)
#   bash samples/gpu_default_rows.sh default OUT       # the default, the same cells (~5 min)
#   bash samples/gpu_default_rows.sh kernels OUT       # one layer's step at GLM 1M, Llama 128K and 256K (~2 min)
#   bash samples/gpu_default_rows.sh flat OUT          # the flat scan, the Llama cells (~5 min)
#   bash samples/gpu_default_rows.sh tail OUT          # the flat scan with the int8 tail, 128K and 256K batch 1
#   bash samples/gpu_default_rows.sh merge-small OUT   # bench_kernels with the live merge on, then off (~2 min)
# then, from the files the machine sent back:
#   python samples/bench_e2e.py --summarize OUT/glm OUT/llama --json e2e.json
#   python samples/profile_layers.py OUT/glm/result-*.json
# usage: on the GPU machine, project root, vLLM 0.26 and this project on PYTHONPATH (e.g. after .gw/setup.sh).
# The GLM profiles take two windows (bench_e2e.profile_decode): their difference is the decode alone, without each
# request's prefill step and calibration. Every engine's --time-limit leaves its cells room after a warm start;
# --total-s leaves 120 s for the engine in flight.
set -euo pipefail
STAGE=${1:?usage: gpu_default_rows.sh glm-flash|glm-default|flash|default|kernels|flat|tail|merge-small OUT}
OUT=${2:?usage: gpu_default_rows.sh glm-flash|glm-default|flash|default|kernels|flat|tail|merge-small OUT}
BATCH=${BATCH-131072:3}
# GLM depths: LAYERS=8 alone saves a short device budget the 2-layer engine (host-bound there, so no fit from it)
LAYERS=${LAYERS-2,8}
KERNELS=${KERNELS:-$(git rev-parse --short HEAD 2>/dev/null || echo local)}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
glm() {
  python3 samples/bench_e2e.py --shape glm4-9b-1m --layers "$LAYERS" --contexts 1048576 --backends "$1" \
    --candidates auto --kernels "$KERNELS" --no-prefix-walk --reps 3 --profile-steps 64 \
    --timeout 575 --total-s 580 --time-limit 540 --out "$OUT/glm" 2>&1 | tail -12
}
llama() {
  python3 samples/bench_e2e.py --shape llama3.1-8b --contexts 131072,262144 ${2:+--batch "$2"} --backends "$1" \
    --candidates auto --kernels "$KERNELS" --decode 32,160 --reps 3 \
    --timeout 580 --total-s 585 --time-limit 560 --out "$OUT/llama" 2>&1 | tail -14
}
case "$STAGE" in
  glm-flash) glm flash ;;
  glm-default) glm locks-2l ;;
  flash) llama flash "$BATCH" ;;
  default) llama locks-2l "$BATCH" ;;
  flat) llama locks "$BATCH" ;;
  tail) llama locks-tail "" ;;
  kernels)
    python3 samples/bench_kernels.py --out "$OUT/kernels" --two-level 4,8,16,32,64 --live 64 --reps 15 2>&1 | tail -8 ;;
  merge-small)
    # the live merge (select.MERGE_SMALL, 512 by default) against the capacity-wide one (0), same machine, in turn
    for m in 512 0; do
      python3 samples/bench_kernels.py --out "$OUT/merge$m" --two-level 4,16,64 --live 64 --reps 15 \
        --merge-small "$m" 2>&1 | tail -4
    done ;;
  *)
    echo "unknown stage $STAGE: glm-flash, glm-default, flash, default, kernels, flat, tail or merge-small"; exit 2 ;;
esac
