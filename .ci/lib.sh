# Shell helpers shared by .ci/run and .ci/arm64.sh (sourced; needs bash >= 5.1 for `wait -p`).
# The caller sets ROOT (the checkout: logs go to $ROOT/build/ci-logs/).

# per_family FN ISA...: `FN ISA` once per family, $CI_JOBS at a time (default: the cores; these
# runs are mostly one Python thread each, so two share a 2-core machine well). Each run writes
# its own log (build/ci-logs/), printed whole, in the order the runs end; fails when one failed.
per_family() {
  local fn=$1 isa pid rc failed=() ; shift
  local -A name=()
  mkdir -p "$ROOT/build/ci-logs"
  reap() {   # wait for one run to end; print its log
    rc=0; wait -n -p pid || rc=$?
    echo "---- $fn ${name[$pid]} (exit $rc)"; cat "$ROOT/build/ci-logs/$fn-${name[$pid]}.log"
    (( rc == 0 )) || failed+=("${name[$pid]}"); unset "name[$pid]"
  }
  for isa in "$@"; do
    while (( ${#name[@]} >= ${CI_JOBS:-$(nproc)} )); do reap; done
    "$fn" "$isa" > "$ROOT/build/ci-logs/$fn-$isa.log" 2>&1 &
    name[$!]=$isa
  done
  while (( ${#name[@]} > 0 )); do reap; done
  if (( ${#failed[@]} )); then echo "$fn failed on: ${failed[*]}"; return 1; fi
}
