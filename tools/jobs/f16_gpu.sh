#!/bin/bash
# Issue 24's GPU run: the fp16/bf16 tensor-core kernels (compute_cuda_mma_f16.py) on one H100 or
# H200 (device kind nvidia-h200; on nvidia-h200-x2 two steps can run side by side, one per GPU:
# CUDA_VISIBLE_DEVICES=1 bash tools/jobs/f16_gpu.sh tests & bash tools/jobs/f16_gpu.sh sweep).
# Untuned kernels (the device has no tuning database): the JSON says so per row.
#
# TVM comes from the bundle of ../shared/device/README.md, humming-kernels from .whl (both as in
# tools/jobs/model_gpu.sh), one call right after the other, from the repository root:
#
#   call 1  carry [".devcache/tvm-a"]          command: bash .devcache/tvm-a/setup.sh
#   call 2  carry [".devcache/tvm-b", ".whl"]  command: bash .devcache/tvm-b/setup.sh && bash tools/jobs/f16_gpu.sh sweep
#
# Steps (arguments, in this order; none: tests sweep):
#   tests    the marked GPU tests of the fp16/bf16 kernels (pytest -m cuda), ~3 min
#   sweep    tools/bench.py kernels, 4-bit g128 fp16 x, 8192x28672, 28672x8192, 8192x8192,
#            4096x4096, M = 1, 2, 4, 8, 16, with fp16 linear, torch int4 and humming, ~3.5 min
#   low-bits the same at 2, 3 and 8 bits on 8192x28672 (BITS=...), ~2.5 min
#   splits   tools/studies/f16_split_sweep.py: k_split's choice against other splits and word
#            buffers on the shapes of the sweep at M = 1 and 16, ~3 min
#   stages   the same study at the rule's split: words in register buffers (stages 0) against
#            cp.async stages in shared memory (STAGES=0,3,4), the sweep's shapes and
#            Llama-2-7B's at M = 1 and 16, ~6 min
# Writes under $OUT: <step>.json (and sweep.png), <step>.log, steps.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/jobs/steps.sh
out=${OUT:-/tmp/f16-gpu-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/tvmsite:$PWD:/tmp/site
export XDG_CACHE_HOME=/tmp/qcompile-cache  # kernel cache and (empty) tuning database
if [ -d .whl ] && [ ! -d /tmp/site/humming ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
fi
shapes=${SHAPES:-8192x28672,28672x8192,8192x8192,4096x4096}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests sweep)
status=0
for step in "${steps[@]}"; do
  start=$SECONDS
  case $step in
    tests)
      timeout 420 python3 -m pytest -q -m cuda -p no:cacheprovider tests/cuda/test_uniform_mma_f16_cuda.py \
        > "$out/tests.log" 2>&1 ;;
    sweep)
      timeout 420 python3 tools/bench.py kernels --preset cuda-f16 --shapes "$shapes" \
        --batches "${BATCHES:-1,2,4,8,16}" --activations "${ACTIVATIONS:-float16}" --rounds 5 \
        --json "$out/sweep.json" --plot "$out/sweep.png" > "$out/sweep.log" 2>&1 ;;
    low-bits)
      timeout 420 python3 tools/bench.py kernels --preset cuda-f16 --shapes "${LOW_SHAPES:-8192x28672}" \
        --batches "${BATCHES:-1,2,4,8,16}" --bits "${BITS:-2,3,8}" --activations float16 --rounds 5 \
        --json "$out/low-bits.json" > "$out/low-bits.log" 2>&1 ;;
    splits)
      timeout 420 python3 tools/studies/f16_split_sweep.py --shapes "$shapes" --batches 1,16 \
        --splits "${SPLITS:-rule,2,4,8,16}" --buffers "${BUFFERS:-2,3}" --rounds 7 \
        --json "$out/splits.json" > "$out/splits.log" 2>&1 ;;
    stages)
      timeout 560 python3 tools/studies/f16_split_sweep.py \
        --shapes "${STAGE_SHAPES:-$shapes,4096x12288,4096x22016,11008x4096}" --batches "${BATCHES:-1,16}" \
        --bits "${BITS:-4}" --splits rule --stages "${STAGES:-0,3,4}" --rounds 5 \
        --json "$out/stages.json" > "$out/stages.log" 2>&1 ;;
    *)
      echo "f16_gpu.sh: unknown step $step (tests, sweep, low-bits, splits, stages)" >&2; exit 2 ;;
  esac
  rc=$?
  report_step f16_gpu.sh "$step" "$rc" "$start" "$out"
  [ "$rc" -ne 0 ] && status=$rc
done
exit $status
