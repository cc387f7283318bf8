#!/usr/bin/env bash
# Issue 47's RULER table at 100 samples a task (seed 1234, the six tasks that need no download, 16K and 32K): dense,
# the default selection at 2,048 tokens, the exact-LSE oracle at 2,048, then the flat scan and the tail estimate
# with what device time is left. One setting and length a stage, one stage a call (each under the call's 10
# minutes; a setting stopped by its limit keeps the tasks it finished, in its part file), every stage on one
# machine, in this order (the first 50 samples of each task are the earlier 50-sample runs' own, so those answers
# are a check that the samples and the engine are the same):
#   bash samples/gpu_ruler_rows.sh dense-16k OUT     # ~3 min each at 16K, ~4-5 at 32K (eager, 50-sample runs x 2)
#   bash samples/gpu_ruler_rows.sh default-16k OUT
#   bash samples/gpu_ruler_rows.sh oracle-16k OUT    # the oracle reads every key: ~6 min
#   bash samples/gpu_ruler_rows.sh dense-32k OUT; ... default-32k, oracle-32k, then flat-16k, flat-32k, tail-16k,
#   tail-32k
# then, from the files the machine sent back:
#   python samples/bench_ruler.py --table OUT/*/ruler_*.json
# usage: on the GPU machine, project root, after samples/tools/gpu_ruler_bundle.sh's parts and
# samples/tools/gpu_ruler_setup.sh (vLLM, lm-eval, the converted model, punkt_tab and the kept samples in place);
# MODEL, DOCS and NLTK name where that setup put them (its defaults below).
# Every engine as in the 50-sample runs: eager, 16 GiB of KV cache, 32 sequences at once.
set -euo pipefail
STAGE=${1:?usage: gpu_ruler_rows.sh SETTING-LENGTH OUT (dense|default|oracle|flat|tail)-(16k|32k)}
OUT=${2:?usage: gpu_ruler_rows.sh SETTING-LENGTH OUT}
MODEL=${MODEL:-/tmp/evalmodel}
DOCS=${DOCS:-/tmp/ruler_docs}
NLTK=${NLTK:-/tmp/nltk}
export PYTHONUNBUFFERED=1
case "${STAGE%-*}" in
  dense) SETTING=dense ;;
  default) SETTING=locks:2048 ;;
  oracle) SETTING=locks:2048:oracle ;;
  flat) SETTING=locks:2048:flat ;;
  tail) SETTING=locks:2048:tail ;;
  *) echo "unknown stage $STAGE: (dense|default|oracle|flat|tail)-(16k|32k)"; exit 2 ;;
esac
case "${STAGE##*-}" in
  16k) LENGTH=16384 ;;
  32k) LENGTH=32640 ;;
  *) echo "unknown stage $STAGE: (dense|default|oracle|flat|tail)-(16k|32k)"; exit 2 ;;
esac
mkdir -p "$OUT"
python3 samples/bench_ruler.py --model "$MODEL" --lengths "$LENGTH" --settings "$SETTING" --limit 100 --eager \
  --docs-cache "$DOCS" --timeout-s 560 --kv-cache-gib 16 --max-num-seqs 32 --nltk-data "$NLTK" \
  --out-dir "$OUT" 2>&1 | tail -15
