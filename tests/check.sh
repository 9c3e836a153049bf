#!/usr/bin/env bash
# check.sh: what `make check` runs. Every suite runs, even after another failed; the run ends
# with one line per suite (result, tests passed/failed/skipped, time), the ten slowest tests of
# the run, the performance smoke's ratios (perf-smoke) with a warning for each more than half
# worse than docs/benchmarks.md's, a warning naming the suites over their budgets
# (tests/README.md) when the whole run took over 30 minutes, and a closing line, and exits 1 if
# anything failed (a slow smoke is not a failure, timings being noisy; a job of it that fails
# is). Suites that need the cluster are reported as failed, not silently dropped, when the
# cluster could not be brought up.
#
#   tests/check.sh [SUITE...]      (default: all, in the order below)
#
# Each suite's whole output is also kept in $CHECK_LOG_DIR/SUITE.log; go test suites write
# their events to SUITE.json, which the counts come from.
#
# cluster-up starts beside the first suite (after the host's packages are in, which both need):
# on a machine whose cluster is not built, it compiles and downloads for about 30 minutes while
# lint and unit leave a core or the network idle, and on a built one it costs a few seconds. Its
# output is printed, and its result counted, in its place in the order.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ALL_SUITES=(lint unit build runner-test cluster-up netpol e2e security soak-short perf-smoke)
CLUSTER_SUITES=" netpol e2e security soak-short perf-smoke "
CACHE=${SANDBOX_EXECUTOR_CACHE:-$HOME/.cache/sandbox-executor}
export CHECK_LOG_DIR=${CHECK_LOG_DIR:-$CACHE/logs/check-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$CHECK_LOG_DIR"

now() { date +%s; }
duration() { local s=$1; printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# counts SUITE: "PASSED FAILED SKIPPED" for the suite's tests. go test suites count their test
# events (subtests included); netpol counts its PASS/FAIL lines; other suites are one check.
counts() {
  local suite=$1 rc=$2 json=$CHECK_LOG_DIR/$1.json log=$CHECK_LOG_DIR/$1.log p f s
  if [[ -s $json ]]; then
    p=$(grep -c '"Action":"pass","Package":"[^"]*","Test":' "$json")
    f=$(grep -c '"Action":"fail","Package":"[^"]*","Test":' "$json")
    s=$(grep -c '"Action":"skip","Package":"[^"]*","Test":' "$json")
    # A package that fails to build or panics has no failed test event of its own.
    if ((rc != 0 && f == 0)); then f=1; fi
  elif [[ $suite == netpol ]]; then
    p=$(grep -c '^PASS ' "$log")
    f=$(grep -c '^FAIL ' "$log")
    s=0
    if ((rc != 0 && f == 0)); then f=1; fi
  elif ((rc == 0)); then
    p=1 f=0 s=0
  else
    p=0 f=1 s=0
  fi
  echo "$p $f $s"
}

# run_suite SUITE: make SUITE, its output to the terminal and SUITE.log; returns its status.
run_suite() {
  TEST_JSON=$CHECK_LOG_DIR/$1.json make --no-print-directory "$1" 2>&1 | tee "$CHECK_LOG_DIR/$1.log"
  return "${PIPESTATUS[0]}"
}

# start_cluster_up SUITE...: when cluster-up is listed after another suite, start it now, in the
# background (its output to cluster-up.log), once the host's packages are in: the unit suite and
# the cluster both install them, and apt takes one install at a time. Sets CLUSTER_UP_PID.
CLUSTER_UP_PID=""
start_cluster_up() {
  [[ " $* " == *" cluster-up "* && $1 != cluster-up ]] || return 0
  echo
  echo "=== host packages, then cluster-up in the background ($(date -u +%H:%M:%S))"
  make --no-print-directory host-packages || return 0
  # A process group of its own (set -m), so that a stopped check stops it too (stop_cluster_up).
  set -m
  (
    start=$(now)
    make --no-print-directory cluster-up >"$CHECK_LOG_DIR/cluster-up.log" 2>&1
    echo "$? $start $(now)" >"$CHECK_LOG_DIR/cluster-up.result"
  ) &
  CLUSTER_UP_PID=$!
  set +m
  trap stop_cluster_up EXIT
  trap 'exit 130' INT TERM
}

stop_cluster_up() {
  [[ -n $CLUSTER_UP_PID ]] && kill -0 "$CLUSTER_UP_PID" 2>/dev/null && kill -TERM -- "-$CLUSTER_UP_PID" 2>/dev/null
  return 0
}

# finish_cluster_up: wait for the background cluster-up, print its log; returns its status.
finish_cluster_up() {
  local rc start end
  wait "$CLUSTER_UP_PID"
  cat "$CHECK_LOG_DIR/cluster-up.log"
  read -r rc start end <"$CHECK_LOG_DIR/cluster-up.result" || rc=1
  echo "(cluster-up ran $(duration $((end - start))) from $(date -u -d "@$start" +%H:%M:%S), beside the suites before it)"
  return "$rc"
}

main() {
  local suites=("$@") suite rc start took p f s total_p=0 total_f=0 total_s=0 cluster_rc=0
  ((${#suites[@]})) || suites=("${ALL_SUITES[@]}")
  local summary=() failed=() times=()
  local begun
  begun=$(now)
  echo "make check: suites ${suites[*]}; logs in $CHECK_LOG_DIR"
  start_cluster_up "${suites[@]}"
  for suite in "${suites[@]}"; do
    start=$(now)
    echo
    echo "=== suite $suite ($(date -u +%H:%M:%S))"
    if [[ $suite == cluster-up && -n $CLUSTER_UP_PID ]]; then
      # Its time in the summary is the wait here: what it added to the run's wall time.
      finish_cluster_up
      rc=$?
    elif [[ $CLUSTER_SUITES == *" $suite "* ]] && ((cluster_rc != 0)); then
      echo "not run: the local cluster did not come up (see cluster-up above)" | tee "$CHECK_LOG_DIR/$suite.log"
      rc=1
    else
      run_suite "$suite"
      rc=$?
    fi
    [[ $suite == cluster-up ]] && cluster_rc=$rc
    took=$(($(now) - start))
    times+=("$suite=$took")
    read -r p f s < <(counts "$suite" "$rc")
    total_p=$((total_p + p)) total_f=$((total_f + f)) total_s=$((total_s + s))
    if ((rc == 0)); then
      summary+=("$(printf 'ok    %-12s %5d passed %3d failed %3d skipped  %s' "$suite" "$p" "$f" "$s" "$(duration "$took")")")
    else
      failed+=("$suite")
      summary+=("$(printf 'FAIL  %-12s %5d passed %3d failed %3d skipped  %s  (log: %s)' "$suite" "$p" "$f" "$s" "$(duration "$took")" "$CHECK_LOG_DIR/$suite.log")")
    fi
  done
  echo
  echo "=== make check summary ($(duration $(($(now) - begun))))"
  printf '%s\n' "${summary[@]}"
  # The slowest tests, the performance smoke's ratios against docs/benchmarks.md's (a warning for
  # each more than half worse), and a warning naming the suites over their budgets
  # (tests/README.md) when the whole run is over 30 minutes. Reported, not failed: timings are noisy.
  go run ./tests/checkreport -dir "$CHECK_LOG_DIR" -budgets tests/README.md -limit 30m \
    -smoke perf-smoke -benchmarks docs/benchmarks.md "${times[@]}" ||
    echo "(the slowest tests, the smoke's ratios and the budgets could not be reported: see above)"
  if ((${#failed[@]})); then
    echo "FAILED suites: ${failed[*]}"
  fi
  echo "check: $total_p passed, $total_f failed, $total_s skipped"
  ((${#failed[@]} == 0))
}

main "$@"
