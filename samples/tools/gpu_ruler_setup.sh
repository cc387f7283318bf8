#!/usr/bin/env bash
# GPU machine side of samples/tools/gpu_ruler_bundle.sh: installs the carried wheels into /tmp/site (beside vLLM), puts
# the GGUF's parts together, checks and converts it to /tmp/evalmodel (bf16), with the tokenizer files of the
# machine that built the kept samples, and copies punkt_tab to /tmp/nltk and the samples to /tmp/ruler_docs.
# usage (project root, .wle carried, after .gw/setup.sh 1..6 and the parts in /tmp/wp and /tmp/wm):
#   bash samples/tools/gpu_ruler_setup.sh
set -euo pipefail
[ -d .wle ] && [ -d /tmp/site/vllm ] || { echo "needs .wle carried and vLLM in /tmp/site (.gw/setup.sh)"; exit 1; }
WHEEL=/tmp/pyarrow-26.0.1-cp312-cp312-manylinux_2_28_x86_64.whl
cat /tmp/wp/part* > "$WHEEL"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$WHEEL" .wle/*.whl 2>&1 | { grep -iv warning || true; }
cat /tmp/wm/part* > /tmp/m.gguf
echo "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32  /tmp/m.gguf" | sha256sum -c
export PYTHONPATH=/tmp/site:$PWD
python3 .wle/convert_gguf_to_hf.py /tmp/m.gguf /tmp/evalmodel --dtype bfloat16 2>&1 | tail -2
cp .wle/tok/* /tmp/evalmodel/
rm -rf /tmp/nltk /tmp/ruler_docs; cp -r .wle/nltk_data /tmp/nltk; cp -r .wle/ruler_docs /tmp/ruler_docs
python3 -c "import lm_eval, datasets, pyarrow, nltk, vllm, locks_engine
print('lm-eval', lm_eval.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__, 'vllm', vllm.__version__)"
echo "samples kept: $(ls /tmp/ruler_docs | wc -l) files"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
