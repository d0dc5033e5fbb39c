#!/bin/bash
# Device job: the GPU model benchmark (python tools/bench.py model-gpu; issue 25, deliverable 4).
#
# Run from the repository root on the GPU machine, carrying .devcache/tvm-b (the TVM bundle;
# on a cold machine carry .devcache/tvm-a first, as .devcache/tvm-b/setup.sh says), .whl
# (humming-kernels) and .whl-tf (transformers 5.x):
#
#   bash tools/jobs/model_gpu.sh smoke    # 2 layers, 2 rounds: every path once (2-2.5 min)
#   bash tools/jobs/model_gpu.sh full     # Llama-2-7B shape, 32 layers, 4-bit g128 (<= 6 min)
#   bash tools/jobs/model_gpu.sh low-bits # the same at 3 and 2 bits, no torch.compile peer
#
# Extra arguments go to the benchmark (e.g. --budget-s 300). Results: $OUT/model_gpu_<mode>.json
# and .log. Caches stay on the machine between calls of one session (the random checkpoints in
# /tmp/qcompile-model-gpu, our kernels in ~/.cache/qcompile, humming's in ~/.humming, inductor's
# in /tmp/torchinductor_*), so run smoke first: the full run then skips most one-time builds.
set -o pipefail
mode=${1:-full}
shift
bash .devcache/tvm-b/setup.sh || exit 1
export PYTHONPATH=/tmp/tvmsite:$PWD
if [ ! -d /tmp/site/transformers ] || [ ! -d /tmp/site/humming ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    .whl-tf/*.whl 2>&1 | tail -2
fi
export PYTHONPATH=$PYTHONPATH:/tmp/site
out=${OUT:-/tmp/model_gpu_out}
mkdir -p "$out"
case $mode in
  smoke)    flags=(--layers 2 --rounds 2 --decode-tokens 32 --budget-s 150); limit=200 ;;
  full)     flags=(); limit=420 ;;
  low-bits) flags=(--bits 3,2 --compile none); limit=420 ;;
  *) echo "usage: bash tools/jobs/model_gpu.sh smoke|full|low-bits [benchmark options]" >&2
     exit 2 ;;
esac
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout "$limit" python3 tools/bench.py model-gpu "${flags[@]}" "$@" \
  --json "$out/model_gpu_$mode.json" 2>&1 | grep -v "USDT:" | tee "$out/model_gpu_$mode.log"
