# shellcheck shell=bash
# shellcheck disable=SC2034  # settings here are used by the scripts that source this file
# lib.sh: shared settings and helpers for the local single-node cluster scripts.
#
# Source it, never execute it:   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Every other script in tests/cluster/ (and tests/cluster/networkpolicy.sh) gets from here:
# the state directory layout, the pinned versions, the network plan and the small helpers
# (logging, step timing, waiting, daemon start/stop by PID file, kubectl/ctr wrappers).
#
# Everything can be overridden from the environment before sourcing (e.g. CLUSTER_DIR=/tmp/c).

if [[ -n ${_SBX_CLUSTER_LIB_LOADED:-} ]]; then return 0; fi
_SBX_CLUSTER_LIB_LOADED=1

# --- where things are -------------------------------------------------------------------
CLUSTER_SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$CLUSTER_SCRIPTS_DIR/../.." && pwd)

# One directory holds all cluster state; build caches (bin/, build/, images/) and logs (log/)
# survive `down.sh --wipe`, everything else under it is state.
CLUSTER_DIR=${CLUSTER_DIR:-${SANDBOX_EXECUTOR_CACHE:-$HOME/.cache/sandbox-executor}/cluster}
CLUSTER_BIN=$CLUSTER_DIR/bin          # built binaries (+ .version stamps)
CLUSTER_BUILD=$CLUSTER_DIR/build      # wrapper Go modules used to build the binaries
CLUSTER_IMAGES=$CLUSTER_DIR/images    # rootfs dirs and OCI tarballs of the local images
CLUSTER_LOG=$CLUSTER_DIR/log          # component logs (kept across down and --wipe)
CLUSTER_RUN=$CLUSTER_DIR/run          # PID files and sockets
CLUSTER_ETC=$CLUSTER_DIR/etc          # generated component configs
CLUSTER_PKI=$CLUSTER_DIR/pki          # CA, certificates, keys
CLUSTER_KUBECONFIGS=$CLUSTER_DIR/kubeconfig
ADMIN_KUBECONFIG=$CLUSTER_KUBECONFIGS/admin.kubeconfig
EXECUTOR_KUBECONFIG=$CLUSTER_KUBECONFIGS/executor.kubeconfig
CONTAINERD_SOCK=$CLUSTER_RUN/containerd.sock
# deploy/local is written by another part of the project; DEPLOY_DIR lets a test point elsewhere.
DEPLOY_DIR=${DEPLOY_DIR:-$REPO_ROOT/deploy/local}

# --- pinned versions (a change here triggers a rebuild through the .version stamps) ------
# Not exported: etcd reads every ETCD_* variable of its environment as a flag.
K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
CONTAINERD_VERSION=v2.2.9
# gVisor of 2026-09-05: its systrap parks an idle sandbox's fast-path monitor and watchdog
# (google/gvisor#13470, #13534). An idle `runsc do sleep 40` here: 0.05 s of CPU against 2.0 s
# with the 2026-05-27 commit, whose idle sentries kept 50-60 millicores each busy (6 warm pool
# pods: a third of a core) under every suite.
GVISOR_VERSION=v0.0.0-20260905035102-160fafc42237
AGENT_SANDBOX_VERSION=v0.5.6
COREDNS_VERSION=v1.15.0
GO_BIN_DIR=${GO_BIN_DIR:-/usr/local/go/bin}

# --- network plan ---------------------------------------------------------------------
# The node IP lives on a bridge with no ports (this kernel has no `dummy` netdev); it never
# leaves the machine. Pods get 10.88.0.0/16 on a second bridge; Services are routed by
# kube-proxy (iptables mode) on this node, and cluster DNS answers at the 10th service IP.
NODE_IP=${NODE_IP:-10.77.0.1}
NODE_BRIDGE=${NODE_BRIDGE:-sbx-node0}
POD_CIDR=${POD_CIDR:-10.88.0.0/16}
POD_GATEWAY=${POD_GATEWAY:-10.88.0.1}
POD_BRIDGE=${POD_BRIDGE:-sbx-pods0}
SERVICE_CIDR=${SERVICE_CIDR:-10.96.0.0/16}
# service_ip N: the Nth address of the service CIDR (1: the kubernetes Service, 10: cluster DNS).
service_ip() { echo "${SERVICE_CIDR%/*}" | awk -F. -v n="$1" '{print $1"."$2"."$3"."$4+n}'; }
KUBERNETES_SERVICE_IP=$(service_ip 1)
CLUSTER_DNS_IP=$(service_ip 10)
CLUSTER_DOMAIN=cluster.local
APISERVER_PORT=6443
APISERVER_URL=https://$NODE_IP:$APISERVER_PORT
# iptables chains owned by net.sh. To let pods reach an extra destination, insert a RETURN
# rule at the top of POD_FORWARD_CHAIN, e.g. `iptables -I SBX-FORWARD 1 -d 10.99.0.0/24 -j RETURN`.
POD_FORWARD_CHAIN=SBX-FORWARD
NODE_INPUT_CHAIN=SBX-INPUT
# IPv6 guard: the pod network is IPv4-only (net.sh).
POD_V6_CHAIN=SBX-PODS6
NODE_NAME=${NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}

# --- images (no registry: imported into containerd, pods use imagePullPolicy: Never) ----
PAUSE_IMAGE=sandbox-executor.local/pause:3.10
CI_IMAGE=sandbox-executor.local/ci:bookworm
POSIX_IMAGE=sandbox-executor.local/posix:bookworm
AGENT_IMAGE_REPO=sandbox-executor.local/agent
# In-cluster components, built from the pinned modules (images.sh), tagged <version>-<binary
# hash> (a rebuilt binary is a new tag, so its Deployment rolls); the refs are in
# $CLUSTER_IMAGES/<name>.ref.
COREDNS_IMAGE_REPO=sandbox-executor.local/coredns
AGENT_SANDBOX_IMAGE_REPO=sandbox-executor.local/agent-sandbox-controller

# --- ports of the local-only endpoints -----------------------------------------------
ETCD_CLIENT_URL=http://127.0.0.1:2379
ETCD_METRICS_URL=http://127.0.0.1:2381
KUBELET_HEALTHZ_URL=http://127.0.0.1:10248/healthz
KUBE_PROXY_HEALTHZ_ADDR=127.0.0.1:10256
KUBE_PROXY_METRICS_ADDR=127.0.0.1:10249
AGENT_SANDBOX_NAMESPACE=agent-sandbox-system
AGENT_SANDBOX_CRDS=(sandboxes.agents.x-k8s.io sandboxclaims.extensions.agents.x-k8s.io
  sandboxtemplates.extensions.agents.x-k8s.io sandboxwarmpools.extensions.agents.x-k8s.io)
# What deploy/local creates and up.sh waits for.
EXECUTOR_NAMESPACE=sandbox-executor
EXECUTOR_SERVICEACCOUNT=sandbox-executor
WARM_POOL=duo-default

export CLUSTER_SCRIPTS_DIR REPO_ROOT CLUSTER_DIR CLUSTER_BIN CLUSTER_BUILD CLUSTER_IMAGES \
  CLUSTER_LOG CLUSTER_RUN CLUSTER_ETC CLUSTER_PKI CLUSTER_KUBECONFIGS ADMIN_KUBECONFIG \
  EXECUTOR_KUBECONFIG CONTAINERD_SOCK DEPLOY_DIR NODE_IP NODE_BRIDGE POD_CIDR POD_GATEWAY POD_BRIDGE \
  SERVICE_CIDR KUBERNETES_SERVICE_IP CLUSTER_DNS_IP CLUSTER_DOMAIN APISERVER_URL POD_FORWARD_CHAIN NODE_INPUT_CHAIN POD_V6_CHAIN NODE_NAME PAUSE_IMAGE CI_IMAGE \
  POSIX_IMAGE AGENT_IMAGE_REPO COREDNS_IMAGE_REPO AGENT_SANDBOX_IMAGE_REPO AGENT_SANDBOX_NAMESPACE EXECUTOR_NAMESPACE EXECUTOR_SERVICEACCOUNT WARM_POOL

# Our binaries first, then the Go toolchain, then the system (runc and CNI come from Debian).
export PATH=$CLUSTER_BIN:$GO_BIN_DIR:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# --- logging ------------------------------------------------------------------------------
log() { printf '[cluster] %s\n' "$*" >&2; }
warn() { printf '[cluster] WARNING: %s\n' "$*" >&2; }
die() { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }

# Milliseconds since the epoch, from bash itself (no date/bc needed on a fresh machine).
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
# fmt_ms MS -> "12.3s"
fmt_ms() { printf '%d.%ds' $(($1 / 1000)) $((($1 % 1000) / 100)); }

# step NAME CMD...: run one step of a bring-up, print how long it took, keep a summary line.
# Steps nest across scripts (up.sh's "build binaries" runs build.sh, whose steps are the
# components): with STEP_SUMMARY_FILE exported, every script's steps add their lines to that file,
# indented by depth and in the order they end (a component before the step that ran it), so
# up.sh's summary shows how long each component took.
STEP_SUMMARY=()
STEP_DEPTH=${STEP_DEPTH:-0}
step() {
  local name=$1 start rc=0
  shift
  start=$(now_ms)
  log "==> $name"
  # A subshell with its own `set -e`: calling "$@" from an `||` list would silently disable
  # errexit inside every function it runs.
  set +e
  (
    set -e
    export STEP_DEPTH=$((STEP_DEPTH + 1))
    "$@"
  )
  rc=$?
  set -e
  local took line
  took=$(fmt_ms $(($(now_ms) - start)))
  line=$(printf '%*s%-*s %8s%s' $((STEP_DEPTH * 2)) '' $((28 - STEP_DEPTH * 2)) "$name" "$took" "$([[ $rc -eq 0 ]] || echo "  FAILED($rc)")")
  if [[ -n ${STEP_SUMMARY_FILE:-} ]]; then
    printf '%s\n' "$line" >>"$STEP_SUMMARY_FILE"
  else
    STEP_SUMMARY+=("$line")
  fi
  if [[ $rc -ne 0 ]]; then
    log "<== $name FAILED (exit $rc) after $took"
    return "$rc"
  fi
  log "<== $name done in $took"
}
print_step_summary() {
  local line lines=("${STEP_SUMMARY[@]}")
  [[ -n ${STEP_SUMMARY_FILE:-} ]] && mapfile -t lines <"$STEP_SUMMARY_FILE"
  log "step timings:"
  for line in "${lines[@]}"; do log "  $line"; done
}

# wait_until DESC TIMEOUT_SECONDS CMD...: poll CMD (quietly) every 0.2 s.
wait_until() {
  local desc=$1 timeout=$2 start
  shift 2
  start=$(now_ms)
  while ! "$@" >/dev/null 2>&1; do
    if (($(now_ms) - start > timeout * 1000)); then
      log "timed out after ${timeout}s waiting for $desc"
      return 1
    fi
    sleep 0.2
  done
  log "$desc: ok after $(fmt_ms $(($(now_ms) - start)))"
}

# netns_veth NS HOSTIF HOST_IP NS_IP: a network namespace linked to this machine by a veth pair
# (/24 on both ends), routed through it: how "the internet", "the GitLab instance" and the
# egress proxy live next to the cluster. Idempotent.
netns_veth() {
  local ns=$1 hif=$2 hip=$3 nip=$4
  ip netns list | awk '{print $1}' | grep -qx "$ns" || ip netns add "$ns"
  if ! ip link show "$hif" >/dev/null 2>&1; then
    ip link add "$hif" type veth peer name eth0 netns "$ns"
  fi
  ip addr replace "$hip/24" dev "$hif"
  ip link set "$hif" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr replace "$nip/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route replace default via "$hip"
}

ensure_dirs() {
  mkdir -p "$CLUSTER_BIN" "$CLUSTER_BUILD" "$CLUSTER_IMAGES" "$CLUSTER_LOG" "$CLUSTER_RUN" \
    "$CLUSTER_ETC" "$CLUSTER_PKI" "$CLUSTER_KUBECONFIGS"
}

# --- version stamps (skip work that is already done for the pinned version) ------------
# stamp_matches FILE VALUE / stamp_write FILE VALUE
stamp_matches() { [[ -f $1 && "$(cat "$1")" == "$2" ]]; }
stamp_write() { printf '%s\n' "$2" >"$1"; }

# --- daemons: started by us, tracked by PID file, stopped only by that PID file --------
# A PID file is trusted only if the process still runs the executable we started
# (recorded next to it), so a recycled PID never gets a signal from us.
pid_file() { echo "$CLUSTER_RUN/$1.pid"; }

# daemon_pid NAME: print the PID if NAME is running as we started it, else fail.
daemon_pid() {
  local pf exe pid cur
  pf=$(pid_file "$1")
  [[ -f $pf ]] || return 1
  pid=$(cat "$pf")
  exe=$(cat "$CLUSTER_RUN/$1.exe" 2>/dev/null) || return 1
  [[ -n $pid ]] || return 1
  cur=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  # "(deleted)": the binary was rebuilt while the daemon runs; it is still ours.
  [[ $cur == "$exe" || $cur == "$exe (deleted)" ]] || return 1
  echo "$pid"
}
daemon_running() { daemon_pid "$1" >/dev/null; }

# start_daemon NAME BINARY ARGS...: start detached (own session), log to $CLUSTER_LOG/NAME.log.
# The previous log is kept as NAME.log.1 so that readiness greps only see this run.
# Environment for the daemon can be passed with `env` semantics via DAEMON_ENV=(K=V ...).
start_daemon() {
  local name=$1 bin=$2 logf
  shift 2
  if daemon_running "$name"; then
    log "$name already running (pid $(daemon_pid "$name"))"
    return 0
  fi
  [[ -x $bin ]] || die "$name: $bin is not executable"
  logf=$CLUSTER_LOG/$name.log
  [[ -f $logf ]] && mv -f "$logf" "$logf.1"
  # setsid: the daemon outlives this script and gets no terminal signals.
  setsid env "${DAEMON_ENV[@]}" "$bin" "$@" >"$logf" 2>&1 </dev/null &
  local pid=$!
  readlink -f "$bin" >"$CLUSTER_RUN/$name.exe"
  echo "$pid" >"$(pid_file "$name")"
  # env execs the binary; give it a moment so the exe check sees the real program.
  for _ in $(seq 1 50); do
    [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$bin")" ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  kill -0 "$pid" 2>/dev/null || { tail -n 20 "$logf" >&2; die "$name exited right after start (log: $logf)"; }
  log "started $name (pid $pid, log $logf)"
}
DAEMON_ENV=()

# stop_daemon NAME [TIMEOUT_SECONDS]: SIGTERM, then SIGKILL after the timeout.
stop_daemon() {
  local name=$1 timeout=${2:-15} pid i
  if pid=$(daemon_pid "$name"); then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 $((timeout * 10))); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name (pid $pid) still running ${timeout}s after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$(pid_file "$name")" "$CLUSTER_RUN/$name.exe"
}

# with_progress WHAT LOGFILE CMD...: run CMD with its output appended to LOGFILE, and say every
# PROGRESS_EVERY seconds (default 30) that WHAT is still running, how long it has taken and the
# log's last line, so a long first build is not minutes of silence. Returns CMD's status.
with_progress() {
  local what=$1 logf=$2 start pid rc=0 ticks=0 every=${PROGRESS_EVERY:-30}
  shift 2
  start=$(now_ms)
  "$@" >>"$logf" 2>&1 &
  pid=$!
  # One-second steps, so a short command ends the loop at once and a long one reports on time.
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    ticks=$((ticks + 1))
    if ((ticks % every == 0)) && kill -0 "$pid" 2>/dev/null; then
      log "    $what: $(fmt_ms $(($(now_ms) - start))) so far ($(tail -n 1 "$logf" 2>/dev/null | cut -c1-90))"
    fi
  done
  wait "$pid" || rc=$?
  return "$rc"
}

# kill_daemon NAME: SIGKILL, and wait until the process is gone (its sockets closed by the kernel).
kill_daemon() {
  local name=$1 pid
  pid=$(daemon_pid "$name") || die "$name is not running"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]; do sleep 0.05; done
  rm -f "$(pid_file "$name")" "$CLUSTER_RUN/$name.exe"
  log "killed $name (pid $pid)"
}

# --- clients ---------------------------------------------------------------------------
# http_get [CURL_ARGS...] URL: body of a local health endpoint, failing on HTTP errors.
http_get() { curl -sf --max-time 3 "$@"; }
# Always our own kubectl (a system kubectl may be of another version or point elsewhere).
kubectl_admin() { "$CLUSTER_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
# ctr warns about cgroup v1 on every call; that is known (the host has no v2) and only noise.
ctr_k8s() {
  "$CLUSTER_BIN/ctr" --address "$CONTAINERD_SOCK" --namespace k8s.io "$@" 2> >(grep -v 'support for cgroup v1 is deprecated' >&2)
}

# warm_pool_state: print "READY/WANT" for $EXECUTOR_NAMESPACE/$WARM_POOL and succeed when the
# pool is full. Both the pool's status and its pods must say Ready: right after a restart the
# pool status can still carry the numbers from before the restart.
warm_pool_state() {
  local want selector status_ready pods_ready
  read -r want status_ready selector < <(kubectl_admin -n "$EXECUTOR_NAMESPACE" get sandboxwarmpool "$WARM_POOL" \
    -o jsonpath='{.spec.replicas} {.status.readyReplicas} {.status.selector}{"\n"}' 2>/dev/null) || true
  if [[ -z $want ]]; then
    echo "warm pool $EXECUTOR_NAMESPACE/$WARM_POOL not found"
    return 1
  fi
  # An empty status (new pool) shifts the fields: readyReplicas is then absent.
  [[ $status_ready == *=* ]] && { selector=$status_ready; status_ready=0; }
  pods_ready=0
  # Only pods with the current agent count: right after a new agent, the pool's status still
  # reports the pods it is about to replace.
  local agent_ref
  agent_ref=$(cat "$CLUSTER_IMAGES/agent.ref" 2>/dev/null) || true
  if [[ -n $selector ]]; then
    pods_ready=$(kubectl_admin -n "$EXECUTOR_NAMESPACE" get pods -l "$selector" \
      -o jsonpath='{range .items[*]}{.spec.initContainers[0].image} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
      grep -cx "$agent_ref True") || true
  fi
  echo "$EXECUTOR_NAMESPACE/$WARM_POOL ready ${status_ready:-0}/$want (pods Ready with agent ${agent_ref##*:}: $pods_ready)"
  ((want > 0 && ${status_ready:-0} == want && pods_ready == want))
}

# Go builds: the module proxy only, no cgo, reproducible paths.
go_env() {
  [[ -x $GO_BIN_DIR/go ]] || die "Go toolchain not found in $GO_BIN_DIR (set GO_BIN_DIR)"
  export CGO_ENABLED=0
}

# module_dir MODULE@VERSION: fetch a Go module through the module proxy (or the module cache)
# and print its read-only source directory.
module_dir() {
  local tmp dir
  go_env
  tmp=$(mktemp -d)
  dir=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  rmdir "$tmp"
  [[ -n $dir && -d $dir ]] || die "could not download $1"
  echo "$dir"
}

# pod_ci_image_report NS POD: the pod runs under gVisor (its kernel is gVisor's, "4.4.0-gvisor"
# like) with the ci image's tools; prints what it found, fails otherwise.
pod_ci_image_report() {
  local out
  # shellcheck disable=SC2016  # expanded inside the pod
  out=$(kubectl_admin -n "$1" exec "$2" -- /bin/bash -c \
    'uname -r && git --version && echo node $(node --version) && command -v npm && curl --version | head -n 1 | cut -d" " -f1,2 && ps --version')
  echo "$out"
  grep -q gvisor <<<"$out"
}

# pod_dns_report NS POD: the pod resolves the kubernetes Service by its cluster name (through the
# kube-dns Service, so kube-proxy's routing from pods too), and resolves nothing outside.
pod_dns_report() {
  local out
  out=$(kubectl_admin -n "$1" exec "$2" -- /bin/sh -c \
    "getent hosts kubernetes.default.svc.$CLUSTER_DOMAIN; getent hosts kube-dns.kube-system; getent hosts example.com || echo 'example.com: no answer'")
  echo "$out"
  grep -q "^$KUBERNETES_SERVICE_IP .*kubernetes.default.svc" <<<"$out" && grep -q "^$CLUSTER_DNS_IP " <<<"$out" &&
    grep -qx 'example.com: no answer' <<<"$out"
}

# run_main "$@": call main only when the file is executed, not when it is sourced.
# (Scripts pass BASH_SOURCE[1] implicitly: the caller of run_main is the script itself.)
run_main() {
  if [[ ${BASH_SOURCE[1]} == "$0" ]]; then main "$@"; fi
}
