#!/bin/bash
# Issue 26's GPU run: tools/bench_tp.py on one host's H200s (device kind nvidia-h200-x2, or
# nvidia-h200-x4 for TP = 4: ask `status` which kinds are lent).
# Llama-70B and Granite-20B MLPs, M = 1,2,4,8,16, naive / tp_aware / rank_sorted, on qcompile's
# fp16 kernels and on the torch fallback; one torchrun job per TP size. Untuned kernels (the
# device has no tuning database): each row of the JSON says so.
#
# The device has torch but no TVM: TVM comes from the bundle of ../shared/device/README.md
# (`bash ../shared/device/make-tvm-bundle.sh` here once), in two calls made one right after
# the other, from the repository root:
#
#   call 1  carry [".devcache/tvm-a"]  command: bash .devcache/tvm-a/setup.sh
#   call 2  carry [".devcache/tvm-b"]  command: bash .devcache/tvm-b/setup.sh && bash tools/jobs/tp_gpu.sh build tp1
#   call 3  carry [".devcache/tvm-b"]  command: bash .devcache/tvm-b/setup.sh && bash tools/jobs/tp_gpu.sh tp2
#   call 4  (four GPUs)                 command: bash .devcache/tvm-b/setup.sh && bash tools/jobs/tp_gpu.sh tp4
# On four GPUs, build for every size first: TP_SIZES=1,2,4 bash tools/jobs/tp_gpu.sh build tp1
#
# Steps (arguments, in this order; none: build, tp1, tp2, about 7 minutes, close to the device's 10):
#   build   bench_tp --build-only --tp $TP_SIZES (default 1,2): every kernel, in parallel
#           processes (~1.5 min)
#   tpN     torchrun --nproc-per-node N, N = 1, 2 or 4 (~2.5-3 min each; at most 4: `timeout`);
#           rows M = 1 and 16 also hold every algorithm's GPU time per kernel (--profile)
# Kernels are cached in /tmp/qcompile-cache, which lasts while the machine stays warm; a torchrun
# that finds a kernel missing builds it on first use, one rank at a time (slower, still right).
# Writes under $OUT: build.log, tpN.json, tpN.log for each N (the JSON is rewritten
# after every row, so a run cut short keeps what it measured).
# Smoke test on a CPU (gloo, avx2 kernels, float32 x), with python3 and torchrun of the venv
# on PATH: MODELS=tiny ROWS=1,16 OUT=/tmp/tp-smoke bash tools/jobs/tp_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/tp-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/tvmsite:$PWD
export XDG_CACHE_HOME=/tmp/qcompile-cache  # kernel cache and (empty) tuning database
export NCCL_NVLS_ENABLE=0                  # no NVLink multicast on shared hosts
common=(--models "${MODELS:-llama70b,granite20b}" --rows "${ROWS:-1,2,4,8,16}")
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build tp1 tp2)
status=0
for step in "${steps[@]}"; do
  start=$SECONDS
  case $step in
    build)
      timeout 240 python3 tools/bench_tp.py --build-only --tp "${TP_SIZES:-1,2}" --jobs "$(nproc --all)" "${common[@]}" \
        2>&1 | tee "$out/build.log" ;;
    tp1|tp2|tp4)
      size=${step#tp}
      timeout "${STEP_LIMIT:-240}" torchrun --standalone --nproc-per-node "$size" tools/bench_tp.py \
        "${common[@]}" --backends torch-dequant,qcompile --iterations 50 --repeats 7 --profile 1,16 \
        --json "$out/$step.json" \
        2>&1 | tee "$out/$step.log" ;;
    *)
      echo "tp_gpu.sh: unknown step $step (build, tp1, tp2, tp4)" >&2; exit 2 ;;
  esac
  rc=${PIPESTATUS[0]}
  echo "tp_gpu.sh: $step exited $rc after $((SECONDS - start)) s" | tee -a "$out/steps.log"
  [ "$rc" -ne 0 ] && status=$rc
done
exit $status
