# Sourced by the GPU-machine job scripts (f16_gpu.sh, packs_gpu.sh): the line each step ends
# with. report_step NAME STEP RC START OUT: the step's exit status and seconds (from START, a
# $SECONDS value) into OUT/steps.log, then the last lines of OUT/STEP.log.
report_step() {
  echo "$1: $2 exited $3 after $((SECONDS - $4)) s" | tee -a "$5/steps.log"
  tail -3 "$5/$2.log"
}
