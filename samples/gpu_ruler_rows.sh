#!/usr/bin/env bash
# Issue 47's RULER table at 100 samples a task (seed 1234, the six tasks that need no download, 16K and 32K): dense,
# the default selection at 2,048 tokens, the exact-LSE oracle at 2,048, then the flat scan, the tail estimate and the
# default at larger budgets with what device time is left. The stages of one call run side by side on the one GPU,
# to overlap the engines' starts and eager decode steps, which keep the GPU waiting on the host (how much that saves
# is not measured yet): each engine has its own KV cache and asks for a quarter of the GPU free at its start, each
# stage is its own bench_ruler.py process, started 20 s apart, all stopped BUDGET_S (560) seconds after the script's
# start; a stage stopped so keeps the tasks it finished. Every stage of a table on one machine (the
# first 50 samples of each task are the earlier 50-sample runs' own: those answers check that the samples and the
# engine are the same):
#   bash samples/gpu_ruler_rows.sh dense-16k default-16k oracle-16k flat-16k OUT
#   bash samples/gpu_ruler_rows.sh dense-32k default-32k oracle-32k flat-32k OUT
# A stage may name some tasks: oracle-32k:ruler_cwe,ruler_fwe. Then, from the files the machine sent back:
#   python samples/bench_ruler.py --table OUT/*/ruler_*.json
# usage: on the GPU machine, project root, after samples/tools/gpu_ruler_bundle.sh's parts and
# samples/tools/gpu_ruler_setup.sh (vLLM, lm-eval, the converted model, punkt_tab and the kept samples in place);
# MODEL, DOCS and NLTK name where that setup put them (its defaults below), LIMIT the samples a task (100), KV_GIB
# each engine's KV cache (12 GiB: the 32 sequences at 32K; four engines fit an 80 GB GPU). Every engine as in the
# 50-sample runs (which had 16 GiB each, one engine at a time): eager, 32 sequences at once.
set -euo pipefail
USAGE="usage: gpu_ruler_rows.sh STAGE [STAGE ...] OUT; STAGE: (dense|default|oracle|flat|tail|default8192|default16384)-(16k|32k)[:TASK,...]"
[ $# -ge 2 ] || { echo "$USAGE"; exit 2; }
OUT=${!#}; STAGES=("${@:1:$#-1}")
case "$OUT" in *-16k | *-32k | *-16k:* | *-32k:*) echo "the last argument is OUT, not a stage ($OUT); $USAGE"; exit 2 ;; esac
MODEL=${MODEL:-/tmp/evalmodel}
DOCS=${DOCS:-/tmp/ruler_docs}
NLTK=${NLTK:-/tmp/nltk}
LIMIT=${LIMIT:-100}
KV_GIB=${KV_GIB:-12}
BUDGET_S=${BUDGET_S:-560}
export PYTHONUNBUFFERED=1
commands=()
for STAGE in "${STAGES[@]}"; do
  NAME=${STAGE%%:*}; TASKS=""
  [ "$NAME" != "$STAGE" ] && TASKS="--tasks ${STAGE#*:}" && TASKS=${TASKS//,/ }
  case "${NAME%-*}" in
    dense) SETTING=dense ;;
    default) SETTING=locks:2048 ;;
    oracle) SETTING=locks:2048:oracle ;;
    flat) SETTING=locks:2048:flat ;;
    tail) SETTING=locks:2048:tail ;;
    default8192) SETTING=locks:8192 ;;
    default16384) SETTING=locks:16384 ;;
    *) echo "unknown stage $STAGE; $USAGE"; exit 2 ;;
  esac
  case "${NAME##*-}" in
    16k) LENGTH=16384 ;;
    32k) LENGTH=32640 ;;
    *) echo "unknown stage $STAGE; $USAGE"; exit 2 ;;
  esac
  commands+=("python3 samples/bench_ruler.py --model $MODEL --lengths $LENGTH --settings $SETTING $TASKS \
--limit $LIMIT --eager --docs-cache $DOCS --timeout-s @TIMEOUT@ --kv-cache-gib $KV_GIB --max-num-seqs 32 --nltk-data $NLTK \
--gpu-memory-utilization 0.25 --out-dir $OUT")
done
mkdir -p "$OUT/logs"
pids=()
for i in "${!commands[@]}"; do
  [ "$i" -gt 0 ] && sleep 20
  log="$OUT/logs/stage$i.txt"; command=${commands[$i]//@TIMEOUT@/$((BUDGET_S - SECONDS))}
  echo "$command" > "$log"
  bash -c "$command" >> "$log" 2>&1 & pids+=($!)
done
status=0
for i in "${!pids[@]}"; do wait "${pids[$i]}" || { status=1; echo "stage $i failed: $(tail -n 3 "$OUT/logs/stage$i.txt")"; }; done
for i in "${!commands[@]}"; do echo "== ${commands[$i]%% --limit*}"; { grep -E "%|wrote|failed" "$OUT/logs/stage$i.txt" || true; } | tail -n 8; done
exit $status
