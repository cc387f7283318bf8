#!/usr/bin/env bash
# Packs what bench_ruler.py needs on a GPU machine that has no network and takes at most 64 MiB a call (the
# project's tracked files included), beside vLLM's own bundle (../shared/tools/gpu-vllm/prepare.sh, .gw1..6):
#   .wm1..10   the evaluation model's GGUF (../shared/tools/eval-model/fetch.sh keeps it in OUT_DIR.work), 10 parts
#   .wp1..6    pyarrow 26.0.1 for CPython 3.12 (datasets needs pyarrow >= 24), 6 parts: one beside each vLLM chunk
#   .wle       lm-eval[ruler] 0.4.13 and the packages the GPU image lacks (wheels), gguf, the GGUF converter, this
#              machine's tokenizer files (so that the kept samples' fingerprint matches), punkt_tab and the kept
#              RULER samples of --lengths (bench_ruler.py --prepare-docs builds them first)
# usage (from the project root): bash samples/tools/gpu_ruler_bundle.sh MODEL_DIR [LENGTH ...]   (default 16384 32640)
# On the GPU machine, after `bash .gw/setup.sh 1..6` (each call also `cp .wpK/* /tmp/wp/`) and `cp .wmK/* /tmp/wm/`
# (K = 1..10, a call each), one call with .wle carried: `bash samples/tools/gpu_ruler_setup.sh`; then bench_ruler.py
# with --model /tmp/evalmodel --docs-cache /tmp/ruler_docs --nltk-data /tmp/nltk (samples/BENCHMARKS.md).
set -euo pipefail
MODEL=${1:?usage: gpu_ruler_bundle.sh MODEL_DIR [LENGTH ...]}; MODEL=${MODEL%/}; shift
LENGTHS=${*:-16384 32640}
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
GGUF="$MODEL.work/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/locks-chat
[ -f "$GGUF" ] || { echo "no $GGUF: build the model with ../shared/tools/eval-model/fetch.sh $MODEL"; exit 1; }
EXCLUDE=$(git rev-parse --git-path info/exclude)
for d in /.wm*/ /.wp*/ /.wle/; do grep -qxF "$d" "$EXCLUDE" 2>/dev/null || echo "$d" >> "$EXCLUDE"; done
PY=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    --platform any)
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
rm -rf .wm[0-9]* .wp[0-9]* .wle; mkdir -p .wle/ruler_docs .wle/tok
split -n 10 -d -a 2 "$GGUF" "$WORK/m"
for i in $(seq 1 10); do mkdir -p ".wm$i"; mv "$WORK/m$(printf %02d $((i - 1)))" ".wm$i/part$(printf %02d "$i")"; done
"${PY[@]}" -d "$WORK" pyarrow==26.0.1
split -n 6 -d -a 1 "$WORK"/pyarrow-26.0.1-*.whl "$WORK/p"
for i in 1 2 3 4 5 6; do mkdir -p ".wp$i"; mv "$WORK/p$((i - 1))" ".wp$i/part$i"; done
# sdists on the registry: built here as pure-Python wheels
python3 -m pip wheel -q --no-deps -w .wle sqlitedict==2.1.0 rouge_score==0.1.2 word2number==1.1
# lm-eval[ruler] 0.4.13's requirements that neither the GPU image nor vLLM's bundle has (the rest are there)
"${PY[@]}" -d .wle lm_eval==0.4.13 evaluate==0.4.6 datasets==5.2.0 multiprocess==0.70.19 nltk==3.10.4 \
  wonderwords==3.0.1 pytablewriter==1.2.1 dataproperty==1.1.1 mbstrdecoder==1.1.5 pathvalidate==3.3.1 \
  tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 chardet==6.0.0.post1 more-itertools==11.2.1 gguf==0.19.0 \
  platformdirs==4.14.9
cp ../shared/tools/eval-model/convert_gguf_to_hf.py .wle/
cp "$MODEL"/{tokenizer.json,tokenizer_config.json,chat_template.jinja,generation_config.json} .wle/tok/
cp -r "$CACHE/nltk_data" .wle/nltk_data
for n in $LENGTHS; do
  ls "$CACHE"/ruler_docs/*_"${n}"_seed*.json.gz >/dev/null 2>&1 || {
    echo "no kept samples at $n: python samples/bench_ruler.py --model $MODEL --lengths $n --limit 50 --prepare-docs"
    exit 1; }
  cp "$CACHE"/ruler_docs/*_"${n}"_seed*.json.gz .wle/ruler_docs/
done
echo "ready: .wm1..10, .wp1..6, .wle ($(du -sh .wle | cut -f1))"
