#!/bin/bash
# Issue 28's runs on the GPU machine: record packs for its GPU (--target cuda, fp16 x) and for
# its host's Xeon (--target avx512, measured on 2 cores), each checked by a fresh build of
# Llama-2-7B's layer set from the pack (0 trials), and the CUDA search-efficiency curve.
#
# TVM comes from the bundle of ../shared/device/README.md (as in tools/jobs/f16_gpu.sh): the
# bundle's calls first, then, while the machine is warm, one call per step, e.g.
#
#   carry []  command: test -f /tmp/tvmsite/.ok && bash tools/jobs/packs_gpu.sh cuda-packs
#
# Steps (arguments, in this order):
#   cuda-packs    tools/make_packs.py --target cuda (fp16 x) for $MODELS at M = $BATCHES
#                 (default 1,16)
#   avx512-packs  tools/make_packs.py --target avx512 on 2 cores (QCOMPILE_HW=cores=2,
#                 TVM_NUM_THREADS=2; the builds use every core) for $MODELS at M = $BATCHES
#   se-cuda       tools/studies/search_efficiency.py --target cuda, uniform 4-bit 4096x11008
#                 M = 1 (float32 x: the CUDA variant with a space to search), $TRIALS per space
# A packs step then builds Llama-2-7B's layer set at M = 1 from the packs just made, with an
# empty cache and no tuning, and logs its wall time (build-<target>.log); FRESH_BUILD=0 skips it.
# $TIMEOUT (s, default 560) bounds each make_packs; a pack is written when it is tuned, so a
# step cut short leaves the packs it finished (the packs logs are appended to: run a step again
# for the models and batch sizes it did not reach). The two packs steps can run side by side on
# disjoint cores (taskset -c 0-7 ... avx512-packs & taskset -c 8-15 ... cuda-packs): each
# measures only while its own builds wait.
# Writes under $OUT: packs/*.jsonl, <step>.log, se_cuda.json, steps.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/jobs/steps.sh
out=${OUT:-/tmp/packs-gpu-out}
mkdir -p "$out/packs"
export PYTHONPATH=/tmp/tvmsite:$PWD
models=${MODELS:-llama2-7b,llama3-8b,llama2-13b,llama2-70b}
shapes_7b=4096x12288,4096x4096,4096x22016,11008x4096

fresh_build() {  # target, dtype: Llama-2-7B's layer set from the packs, an empty cache
  [ "${FRESH_BUILD:-1}" = 0 ] && return 0
  local target=$1 dtype=$2 cache
  cache=$(mktemp -d)
  cp "$out"/packs/*.jsonl tuning_db/packs/
  local start=$SECONDS
  XDG_CACHE_HOME=$cache QCOMPILE_PACKS=1 python3 -m qcompile.cli build --target "$target" \
    --dtype "$dtype" --shapes "$shapes_7b" --batch 1 --out "$cache/lib" \
    > "$out/build-$target.log" 2>&1
  local rc=$?
  echo "fresh build of $shapes_7b @$target from the packs: rc $rc, $((SECONDS - start)) s wall" \
    | tee -a "$out/build-$target.log"
  return $rc
}

status=0
for step in "$@"; do
  start=$SECONDS
  case $step in
    cuda-packs)
      export XDG_CACHE_HOME=/tmp/qcompile-cache
      timeout "${TIMEOUT:-560}" python3 tools/make_packs.py --models "$models" --batches "${BATCHES:-1,16}" \
        --target cuda --trials "${TRIALS:-8}" --out-dir "$out/packs" >> "$out/$step.log" 2>&1 \
        && fresh_build cuda float16 ;;
    avx512-packs)
      timeout "${TIMEOUT:-560}" env QCOMPILE_HW=cores=2 TVM_NUM_THREADS=2 XDG_CACHE_HOME=/tmp/qcompile-cache \
        python3 tools/make_packs.py --models "$models" --batches "${BATCHES:-1,16}" \
        --target avx512 --trials "${TRIALS:-32}" --out-dir "$out/packs" >> "$out/$step.log" 2>&1 \
        && QCOMPILE_HW=cores=2 TVM_NUM_THREADS=2 fresh_build avx512 float32 ;;
    se-cuda)
      timeout 560 python3 tools/studies/search_efficiency.py --target cuda \
        --shape "${SE_SHAPE:-4096x11008}" --trials "${TRIALS:-64}" --json "$out/se_cuda.json" \
        > "$out/$step.log" 2>&1 ;;
    *)
      echo "packs_gpu.sh: unknown step $step (cuda-packs, avx512-packs, se-cuda)" >&2; exit 2 ;;
  esac
  rc=$?
  report_step packs_gpu.sh "$step" "$rc" "$start" "$out"
  [ "$rc" -ne 0 ] && status=$rc
done
exit $status
