#!/bin/bash
# Issue 25's GPU run (deliverable 4): tools/bench.py model-gpu on one H200 (device kind
# nvidia-h200). A GPTQ Llama of Llama-2-7B's shape (random codes, the real format, written on the
# device), decode tokens/s at B = 1, 4, 16 and prefill tokens/s at 512 tokens on qcompile's fp16
# kernels, against transformers fp16 (static cache, CUDA graphs, and torch.compile) and
# humming-kernels' GPTQ layers; float64 checks first; a profile of our decode steps. Untuned
# kernels (the device has no tuning database): the JSON says so.
#
# The device has torch but no TVM and no transformers: TVM comes from the bundle of
# ../shared/device/README.md, transformers 5.x (.whl-tf) and humming-kernels (.whl) as wheels,
# installed here into /tmp/site. Calls, one right after the other, from the repository root:
#
#   call 1  carry [".devcache/tvm-a"]                      command: bash .devcache/tvm-a/setup.sh
#   call 2  carry [".devcache/tvm-b", ".whl", ".whl-tf"]   command: bash .devcache/tvm-b/setup.sh && bash tools/jobs/model_gpu.sh smoke
#   call 3  carry [".devcache/tvm-b", ".whl", ".whl-tf"]   command: bash .devcache/tvm-b/setup.sh && bash tools/jobs/model_gpu.sh full
#   (call 4, optional: the same with `low-bits`)
#
# Steps (arguments, in this order; none: full):
#   smoke     2 decoder layers of the same shapes, 2 rounds: every path once, and the one-time
#             builds (our kernels, humming's JIT, inductor's kernels) cached for full (~2-2.5 min)
#   full      32 layers, 4-bit g128, ours and transformers also compiled (<= 9 min; --budget-s
#             480 skips what would not fit, and says so; a target whose peer mode was skipped
#             is not judged)
#   low-bits  32 layers at 3 and 2 bits, no compiled peer (<= 6 min)
# Caches last while the machine stays warm: the checkpoints in /tmp/qcompile-model-gpu, our
# kernels in /tmp/qcompile-cache, humming's in ~/.humming, inductor's in /tmp/torchinductor_*.
# Writes under $OUT: <step>.json (rewritten after every phase, so a run cut short keeps what it
# measured), <step>.log, steps.log. More benchmark options after the steps: EXTRA="--rounds 7".
# Smoke test on a CPU (avx2 kernels, float32, eager steps), with python3 of the venv on PATH:
#   MODEL=tiny TARGET=avx2 EXTRA="--compile-backend aot_eager" OUT=/tmp/model-gpu-smoke \
#     bash tools/jobs/model_gpu.sh smoke
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/model-gpu-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/tvmsite:$PWD:/tmp/site
export XDG_CACHE_HOME=/tmp/qcompile-cache  # kernel cache and (empty) tuning database
if [ -d .whl-tf ] && [ -d .whl ] && { [ ! -d /tmp/site/transformers ] || [ ! -d /tmp/site/humming ]; }; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    .whl-tf/*.whl 2>&1 | tail -2
fi
common=(--model "${MODEL:-llama2-7b}" --target "${TARGET:-cuda}")
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(full)
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
status=0
for step in "${steps[@]}"; do
  start=$SECONDS
  case $step in
    smoke)    flags=(--layers 2 --rounds 2 --decode-tokens 32 --budget-s 150); limit=200 ;;
    full)     flags=(--budget-s 480); limit=540 ;;
    low-bits) flags=(--bits 3,2 --compile none); limit=420 ;;
    *) echo "model_gpu.sh: unknown step $step (smoke, full, low-bits)" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2086  # EXTRA is a list of options
  timeout "$limit" python3 tools/bench.py model-gpu "${common[@]}" "${flags[@]}" ${EXTRA:-} \
    --json "$out/$step.json" 2>&1 | grep --line-buffered -v "USDT:" | tee "$out/$step.log"
  rc=${PIPESTATUS[0]}
  echo "model_gpu.sh: $step exited $rc after $((SECONDS - start)) s" | tee -a "$out/steps.log"
  [ "$rc" -ne 0 ] && status=$rc
done
exit $status
