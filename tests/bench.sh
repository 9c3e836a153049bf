#!/usr/bin/env bash
# bench.sh: run the benchmarks on the local cluster (make bench) and write docs/benchmarks.md with
# the table, the machine and the versions. Every figure is measured in the same run as the
# baseline it is compared with.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -tags e2e -run '^$' -bench "${BENCH:-.}" -benchtime 1x -count 1 -timeout 100m ./tests/e2e/ 2>&1 | tee "$out" >&2
grep -q '^ok' "$out" || { echo "bench.sh: the benchmarks failed" >&2; exit 1; }
# The scale section of the last run, kept when this run does not measure scale (BENCH_SCALE=0).
previous_scale=$(sed -n '/^## Control-plane scale (kwok)/,$p' docs/benchmarks.md 2>/dev/null || true)
# The performance smoke's section (BenchmarkSmoke, whose ratios make check compares with these:
# tests/checkreport), kept when this run does not measure it (BENCH names other benchmarks).
smoke_header='## Performance smoke (make check)'
previous_smoke=$(awk -v h="$smoke_header" '$0 == h {p = 1; print; next} p && /^## / {exit} p' docs/benchmarks.md 2>/dev/null || true)
cluster_dir=${CLUSTER_DIR:-${SANDBOX_EXECUTOR_CACHE:-$HOME/.cache/sandbox-executor}/cluster}
cluster_bin=$cluster_dir/bin cluster_etc=$cluster_dir/etc
{
  echo "# Benchmarks"
  echo
  echo "Written by \`make bench\` ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD)). Each row: n, median, p95, min, max;"
  echo "ratios are against the baseline measured in the same run (the first row of its group)."
  echo
  echo '```'
  sed -n 's/^BENCH //p' "$out" | grep -v '^smoke: ' || true
  echo '```'
  echo
  echo "## Machine and versions"
  echo
  echo "- $(nproc) CPUs, $(free -g | awk '/^Mem:/ {print $2}') GiB, kernel $(uname -r)"
  echo "- $(go version)"
  echo "- Kubernetes $("$cluster_bin/kubectl" version --client -o json 2>/dev/null | sed -n 's/.*"gitVersion": "\(.*\)".*/\1/p' | head -1), containerd $("$cluster_bin/containerd" --version 2>/dev/null | awk '{print $3}'), runsc $("$cluster_bin/runsc" --version 2>/dev/null | head -1 | awk '{print $3}'), agent-sandbox v0.5.6"
  echo "- gVisor platform $(sed -n 's/^ *platform = "\(.*\)"/\1/p' "$cluster_etc/runsc.toml" 2>/dev/null) (RUNSC_PLATFORM of the local cluster; why not KVM here: docs/performance.md)"
  echo "- gitlab-runner $("${SANDBOX_EXECUTOR_GITLAB_RUNNER:-$PWD/../shared/tools/gitlab-runner-17.9.0/gitlab-runner}" --version 2>/dev/null | awk '/^Version/ {print $2}')"
  if grep -q '^BENCH flow startup' "$out"; then
    echo
    echo "## Stock Duo flow startup"
    echo
    echo "BenchmarkStockFlowStartup (tests/e2e/bench_stockflow_test.go): from the job's hand-out (POST /jobs/request"
    echo "answered by the fake GitLab) to the flow's first line, the duo CLI's WebSocket session reaching the"
    echo "workflow service stand-in (the upgrade, timed on this machine), through gitlab-runner 17.9, warm pods, jobs"
    echo "back to back; the project is cloned first (GIT_DEPTH=1). Both images (stand-ins, v0.0.21) have the duo CLI"
    echo "baked in; GitLab's default image probes SRT before \`duo run\`, the hardened image has no SRT. The"
    echo "images are stand-ins built by tests/cluster/images-duo.sh, not GitLab's. Under each, where its start-up went,"
    echo "split by the runner's stage sections in the job log's FF_TIMESTAMPS times (tools/duoflow StartupPhases), with"
    echo "the claim and the runner helper as the executor's own log lines give them."
    echo
    echo '```'
    # The flow rows and the "of which" rows right under them (the phases of its start-up).
    awk '/^BENCH flow startup/ {flow = 1} flow && /^BENCH (flow startup| +of which)/ {print substr($0, 7); next} {flow = 0}' "$out"
    echo '```'
  fi
  if grep -q '^BENCH smoke: ' "$out"; then
    echo
    echo "$smoke_header"
    echo
    # The date and commit travel with the rows: a run without BenchmarkSmoke keeps them as they are.
    echo "BenchmarkSmoke (tests/e2e/bench_smoke_test.go), measured by \`make bench\` ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD)):"
    echo "the rows with a ratio are the figures \`make check\` compares its perf-smoke suite's with, warning about one more than half worse."
    echo
    echo '```'
    sed -n 's/^BENCH \(smoke: \)/\1/p' "$out"
    echo '```'
  elif [[ -n $previous_smoke ]]; then
    echo
    printf '%s\n' "$previous_smoke"
  fi
} > docs/benchmarks.md
echo "wrote docs/benchmarks.md" >&2

# Control-plane scale with kwok-simulated nodes (make bench-scale; tools/scale). BENCH_SCALE=0 skips it.
if [[ ${BENCH_SCALE:-1} != 0 ]]; then
  scale=$(mktemp)
  tools/scale/run.sh -out "$scale" >&2 || { rm -f "$scale"; echo "bench.sh: the scale bench failed" >&2; exit 1; }
  {
    echo
    echo "## Control-plane scale (kwok)"
    echo
    # The date and commit travel with the tables: a later BENCH_SCALE=0 run keeps them as they are.
    echo "Measured by \`make bench\` (tools/scale/run.sh, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD)); what limits it: [scale.md](scale.md)."
    echo
    cat "$scale"
  } >> docs/benchmarks.md
  rm -f "$scale"
  echo "appended the control-plane scale tables to docs/benchmarks.md" >&2
elif [[ -n $previous_scale ]]; then
  # Not re-measured: keep the last measured tables, which carry their own date.
  { echo; printf '%s\n' "$previous_scale"; } >> docs/benchmarks.md
  echo "kept the earlier control-plane scale tables (BENCH_SCALE=0)" >&2
fi
