#!/usr/bin/env bash
# NetworkPolicy enforcement for the local single-node test cluster, plus a controlled
# "outside world" for egress tests.
#
# Usage: tests/cluster/networkpolicy.sh build|up|down|status|net-up|net-down|ensure-net
#   build       build kube-router (pinned + one local patch) into $CLUSTER_DIR/bin/kube-router
#               (skipped when $CLUSTER_DIR/bin/.kube-router.version matches)
#   up          build if needed, set up the outside world, start kube-router's network-policy
#               controller (pid $CLUSTER_DIR/run/kube-router.pid, log $CLUSTER_DIR/log/kube-router.log),
#               wait until it has synced its iptables rules. Idempotent.
#   down        stop kube-router by pid, remove its iptables chains/ipsets, tear down the outside world
#   enforcement-down   stop kube-router and remove its rules, keep the outside world (policy not enforced)
#   status      show what is running
#   net-up / net-down   only the outside world (namespaces, HTTP servers, forwarding rules)
#   ensure-net  re-open the outside world in net.sh's guard chain (net.sh up flushes it)
#
# Enforcement: kube-router v2.1.0 (github.com/cloudnativelabs/kube-router/v2, iptables + ipset),
# only its firewall controller (--run-firewall --run-router=false --run-service-proxy=false),
# out-of-cluster with its own client certificate (user system:kube-router, read-only RBAC in
# networkpolicy/kube-router-rbac.yaml). It needs no podCIDR on the Node: it finds local pods by
# status.hostIP == the Node's InternalIP and matches them by pod IP.
# kube-network-policies cannot work here: it needs the nftables "queue" verdict and the kernel has
# no CONFIG_NFT_QUEUE.
#
# The outside world (all on this machine, nothing leaves it; no NAT, the servers see pod IPs):
#   netns sbx-outside  10.99.0.2/24  (node side sbx-out0 10.99.0.1)  HTTP :80 ("the internet")
#                      10.100.0.2/24 (node side 10.100.0.1)          same server, NOT opened for pods
#   netns sbx-gitlab   10.99.1.2/24  (node side sbx-gl0  10.99.1.1)  HTTP :80 and :9090 ("the GitLab
#                      instance": deploy/local's SandboxTemplate policy allows 10.99.1.0/24 TCP 80/443)
# Each server answers GET / with its name (outside, gitlab, gitlab-alt).
# Pods reach them through their default route (configs.sh CNI ipam routes 0.0.0.0/0 via the pod
# bridge); net.sh's SBX-FORWARD drops all pod traffic leaving the pod CIDR, this script inserts
# RETURN rules there for 10.99.0.0/16 only.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -f "$HERE/lib.sh" ]; then
  # shellcheck source=/dev/null
  . "$HERE/lib.sh"
  set -euo pipefail
fi

CACHE_ROOT=${SANDBOX_EXECUTOR_CACHE:-$HOME/.cache/sandbox-executor}
CLUSTER_DIR=${CLUSTER_DIR:-$CACHE_ROOT/cluster}
NODE_IP=${NODE_IP:-10.77.0.1}
POD_CIDR=${POD_CIDR:-10.88.0.0/16}
SVC_CIDR=${SVC_CIDR:-${SERVICE_CIDR:-10.96.0.0/16}}
NODE_NAME=${NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}

KR_MODULE=github.com/cloudnativelabs/kube-router/v2
KR_VERSION=${KUBE_ROUTER_VERSION:-v2.1.0}
KR_PATCH_ID=return-not-accept-1                  # bump when np_patch_kube_router changes
KR_BUILD_DIR=${KR_BUILD_DIR:-${CLUSTER_BUILD:-$CACHE_ROOT/cluster/build}/kube-router}
KR_BIN=$CLUSTER_DIR/bin/kube-router
KR_STAMP=$CLUSTER_DIR/bin/.kube-router.version   # same convention as build.sh
KR_BUILD_LOG=$CLUSTER_DIR/log/build-kube-router.log
KR_PID=$CLUSTER_DIR/run/kube-router.pid
KR_EXE=$CLUSTER_DIR/run/kube-router.exe            # like lib.sh start_daemon: pid is trusted only if /proc/PID/exe matches
KR_LOG=$CLUSTER_DIR/log/kube-router.log
KR_METRICS_PORT=${KR_METRICS_PORT:-20245}     # 127.0.0.1 only; also serves /healthz
KR_SYNC_PERIOD=${KR_SYNC_PERIOD:-1m}          # periodic full resync (policy changes sync immediately)
KR_READY_TIMEOUT=${KR_READY_TIMEOUT:-120}
NP_DIR=$CLUSTER_DIR/netpol                     # kube-router client cert + kubeconfig, HTTP roots
KUBECTL=${KUBECTL:-$CLUSTER_DIR/bin/kubectl}
ADMIN_KUBECONFIG=${ADMIN_KUBECONFIG:-$CLUSTER_DIR/kubeconfig/admin.kubeconfig}

OUTSIDE_CIDR=${OUTSIDE_CIDR:-10.99.0.0/16}
OUT_NS=sbx-outside; OUT_HOSTIF=sbx-out0; OUT_HOST_IP=10.99.0.1; OUT_IP=10.99.0.2
GL_NS=sbx-gitlab;   GL_HOSTIF=sbx-gl0;   GL_HOST_IP=10.99.1.1;  GL_IP=10.99.1.2
HTTP_PORT=80; GL_ALT_PORT=9090   # deploy/local's SandboxTemplate policy allows 10.99.1.0/24 TCP 80/443
NP_COMMENT=sbx-netpol-outside
POD_FORWARD_CHAIN=${POD_FORWARD_CHAIN:-SBX-FORWARD}   # net.sh's guard chain (lib.sh)
UNOPENED_HOST_IP=10.100.0.1; UNOPENED_IP=10.100.0.2    # in netns sbx-outside, NOT opened for pods

log() { echo "networkpolicy: $*" >&2; }
die() { echo "networkpolicy: ERROR: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (iptables, ipset, network namespaces)"; }

# ---------------------------------------------------------------- packages
np_packages() {
  local missing=() p
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  command -v ipset >/dev/null 2>&1 || missing+=(ipset)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  for p in iptables ipset; do command -v $p >/dev/null || die "$p still missing after apt-get install"; done
}

# ---------------------------------------------------------------- build
np_stamp() { echo "$KR_VERSION+$KR_PATCH_ID $(go env GOVERSION)"; }

# Local patch: kube-router ends each of its top-level chains (KUBE-ROUTER-INPUT/FORWARD/OUTPUT) with
# "-m mark --mark 0x20000/0x20000 -j ACCEPT" for traffic its policies allow, and keeps the jump into
# them at position 1 of INPUT/FORWARD/OUTPUT. Upstream that ACCEPT is deliberate ("let network policy
# controller be authoritative"), but here it would bypass the node's own guard chains (net.sh:
# SBX-FORWARD "pods reach no real network", SBX-INPUT "pods open no connection to the node").
# Patched to RETURN: kube-router only ever rejects, everything it allows still meets the node rules.
np_patch_kube_router() { # src_dir
  python3 - "$1/pkg/controllers/netpol/network_policy_controller.go" <<'PY'
import sys
path = sys.argv[1]
src = open(path).read()
old = ('comment := "\\"rule to explicitly ACCEPT traffic that comply to network policies\\""\n'
       '\t\t\targs := []string{"-m", "comment", "--comment", comment, "-m", "mark", "--mark", "0x20000/0x20000",\n'
       '\t\t\t\t"-j", "ACCEPT"}\n')
new = ('comment := "\\"sandbox-executor: traffic that complies with network policies continues to the node rules\\""\n'
       '\t\t\targs := []string{"-m", "comment", "--comment", comment, "-m", "mark", "--mark", "0x20000/0x20000",\n'
       '\t\t\t\t"-j", "RETURN"}\n')
if src.count(old) != 1:
    sys.exit("kube-router patch: pattern not found in " + path)
open(path, "w").write(src.replace(old, new))
PY
}
# np_build_steps: fetch, patch and build kube-router in $KR_BUILD_DIR (output: the caller's log).
np_build_steps() (
  set -e
  cd "$KR_BUILD_DIR"
  # kube-router's sum-database lookup is not reachable; its module zip is fetched unverified by
  # the sum database, every other module is verified against kube-router's own go.sum.
  export GONOSUMDB=github.com/cloudnativelabs/kube-router GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  printf '%s\n' "// Generated by tests/cluster/networkpolicy.sh: builds $KR_MODULE/cmd/kube-router (pinned, patched)." \
    "module sandbox-executor.local/cluster-build/kube-router" "" "go 1.21" "" \
    "require $KR_MODULE $KR_VERSION" "" "replace $KR_MODULE => ./kube-router-src" > go.mod
  rm -f go.sum
  moddir=$(cd / && GOFLAGS=-mod=mod go mod download -json "$KR_MODULE@$KR_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [ -n "$moddir" ] && [ -f "$moddir/go.sum" ] || { echo "could not download $KR_MODULE@$KR_VERSION"; exit 1; }
  rm -rf kube-router-src
  cp -r "$moddir" kube-router-src
  chmod -R u+w kube-router-src
  np_patch_kube_router kube-router-src
  cp kube-router-src/go.sum go.sum
  # shellcheck disable=SC2086  # KR_BUILD_JOBS=1 limits the build to one compile job on a busy machine
  nice -n 10 go build ${KR_BUILD_JOBS:+-p $KR_BUILD_JOBS} -trimpath \
    -ldflags "-s -w -X $KR_MODULE/pkg/version.Version=$KR_VERSION+$KR_PATCH_ID -X $KR_MODULE/pkg/version.BuildDate=$(date -u +%FT%TZ)" \
    -o "$KR_BIN.tmp" "$KR_MODULE/cmd/kube-router"
)

np_build() {
  command -v go >/dev/null || die "go not found in PATH"
  if [ -x "$KR_BIN" ] && [ -f "$KR_STAMP" ] && [ "$(cat "$KR_STAMP")" = "$(np_stamp)" ]; then
    log "kube-router $KR_VERSION+$KR_PATCH_ID: up to date ($KR_BIN)"; return 0
  fi
  log "building kube-router $KR_VERSION+$KR_PATCH_ID in $KR_BUILD_DIR (log $KR_BUILD_LOG)"
  local t0=$SECONDS
  mkdir -p "$KR_BUILD_DIR" "$CLUSTER_DIR/bin" "$CLUSTER_DIR/log"
  : > "$KR_BUILD_LOG"
  if ! with_progress "building kube-router" "$KR_BUILD_LOG" np_build_steps; then
    tail -n 30 "$KR_BUILD_LOG" >&2
    die "kube-router build failed (log: $KR_BUILD_LOG)"
  fi
  mv -f "$KR_BIN.tmp" "$KR_BIN"
  np_stamp > "$KR_STAMP"
  log "built $KR_BIN in $((SECONDS - t0))s: $("$KR_BIN" --version 2>&1 | head -1)" 2>&1 | tee -a "$KR_BUILD_LOG" >&2
}

# ---------------------------------------------------------------- outside world
np_python() {
  local p
  p=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) || true
  [ -x "$p" ] || p=$(command -v python3) || die "python3 not found"
  echo "$p"
}

np_mkns() { netns_veth "$@"; } # ns hostif host_ip ns_ip (lib.sh)

np_http_start() { # name ns ip port
  local name=$1 ns=$2 ip=$3 port=$4 pidf=$CLUSTER_DIR/run/netpol-http-$1.pid
  local root=$NP_DIR/www/$name
  mkdir -p "$root" "$CLUSTER_DIR/run" "$CLUSTER_DIR/log"
  echo "$name" > "$root/index.html"
  local want="http.server $port --bind $ip --directory $root"
  if [ -f "$pidf" ] && tr '\0' ' ' < "/proc/$(cat "$pidf")/cmdline" 2>/dev/null | grep -qF -- "$want"; then
    return 0
  fi
  np_http_stop "$name"   # a server from an older configuration
  setsid nohup ip netns exec "$ns" "$(np_python)" -m http.server "$port" --bind "$ip" --directory "$root" \
      > "$CLUSTER_DIR/log/netpol-http-$name.log" 2>&1 < /dev/null &
  echo $! > "$pidf"
}

np_http_wait() { # name ip port
  for _ in $(seq 1 150); do
    if [ "$(curl -s --max-time 2 "http://$2:$3/" 2>/dev/null)" = "$1" ]; then return 0; fi
    sleep 0.2
  done
  die "HTTP server $1 ($2:$3) did not answer; see $CLUSTER_DIR/log/netpol-http-$1.log"
}

np_http_stop() { # name
  local pidf=$CLUSTER_DIR/run/netpol-http-$1.pid pid
  [ -f "$pidf" ] || return 0
  pid=$(cat "$pidf")
  if kill -0 "$pid" 2>/dev/null && grep -q 'http.server' "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidf"
}

# Open the outside world in the node's pod guard chain (net.sh's $POD_FORWARD_CHAIN, which drops
# every forwarded packet from/to the pod CIDR except pod<->pod): RETURN rules at its top for
# pods -> $OUTSIDE_CIDR and the replies. net.sh flushes that chain whenever it runs, so this is
# idempotent and cheap; netpol-check.sh re-runs it (ensure-net). 10.100.0.0/24 (also in netns
# sbx-outside) is deliberately NOT opened: it shows the node guard still holds with kube-router on.
np_fwd_specs() {
  printf '%s\n' "-s $POD_CIDR -d $OUTSIDE_CIDR -m comment --comment $NP_COMMENT -j RETURN" \
                "-s $OUTSIDE_CIDR -d $POD_CIDR -m comment --comment $NP_COMMENT -j RETURN"
}

np_ensure_fwd() {
  sysctl -qw net.ipv4.ip_forward=1
  if ! iptables -S "$POD_FORWARD_CHAIN" >/dev/null 2>&1; then
    log "note: no $POD_FORWARD_CHAIN chain (net.sh not run yet?): nothing to open for $OUTSIDE_CIDR"
    return 0
  fi
  local spec
  while read -r spec; do
    # shellcheck disable=SC2086
    iptables -C "$POD_FORWARD_CHAIN" $spec 2>/dev/null || iptables -I "$POD_FORWARD_CHAIN" 1 $spec
  done < <(np_fwd_specs)
}

np_fwd_ok() {
  local spec
  while read -r spec; do
    # shellcheck disable=SC2086
    iptables -C "$POD_FORWARD_CHAIN" $spec 2>/dev/null || return 1
  done < <(np_fwd_specs)
}

np_fwd_del() {
  local spec
  while read -r spec; do
    # shellcheck disable=SC2086
    while iptables -D "$POD_FORWARD_CHAIN" $spec 2>/dev/null; do :; done
  done < <(np_fwd_specs)
}

np_net_up() {
  need_root; np_packages
  np_mkns "$OUT_NS" "$OUT_HOSTIF" "$OUT_HOST_IP" "$OUT_IP"
  np_mkns "$GL_NS" "$GL_HOSTIF" "$GL_HOST_IP" "$GL_IP"
  ip addr replace "$UNOPENED_HOST_IP/24" dev "$OUT_HOSTIF"
  ip -n "$OUT_NS" addr replace "$UNOPENED_IP/24" dev eth0
  np_http_start outside "$OUT_NS" 0.0.0.0 "$HTTP_PORT"   # answers on $OUT_IP and $UNOPENED_IP
  np_http_start gitlab "$GL_NS" "$GL_IP" "$HTTP_PORT"
  np_http_start gitlab-alt "$GL_NS" "$GL_IP" "$GL_ALT_PORT"
  np_http_wait outside "$OUT_IP" "$HTTP_PORT"
  np_http_wait outside "$UNOPENED_IP" "$HTTP_PORT"
  np_http_wait gitlab "$GL_IP" "$HTTP_PORT"
  np_http_wait gitlab-alt "$GL_IP" "$GL_ALT_PORT"
  np_ensure_fwd
  np_check_pod_routes
  log "outside world up: $OUT_IP:$HTTP_PORT and (not opened for pods) $UNOPENED_IP:$HTTP_PORT in netns $OUT_NS," \
      "$GL_IP:$HTTP_PORT and :$GL_ALT_PORT in netns $GL_NS"
}

np_net_down() {
  need_root
  np_http_stop outside; np_http_stop gitlab; np_http_stop gitlab-alt
  local ns hif
  for ns in $OUT_NS $GL_NS; do ip netns del "$ns" 2>/dev/null || true; done
  for hif in $OUT_HOSTIF $GL_HOSTIF; do ip link del "$hif" 2>/dev/null || true; done
  if command -v iptables >/dev/null; then np_fwd_del; fi
}

# Warn when the CNI config gives pods no route to the outside world.
np_check_pod_routes() {
  local f found=0
  for f in "$CLUSTER_DIR"/etc/cni/net.d/*.conflist "$CLUSTER_DIR"/etc/cni/net.d/*.conf; do
    [ -f "$f" ] || continue
    found=1
    if ! grep -Eq '"dst" *: *"(0\.0\.0\.0/0|10\.99\.0\.0/16)"' "$f"; then
      log "WARNING: $f has no ipam route to $OUTSIDE_CIDR (or 0.0.0.0/0): pods cannot reach the outside world." \
          "Add {\"dst\": \"$OUTSIDE_CIDR\"} to the bridge plugin's ipam.routes (gateway = the bridge, isGateway: true)."
    fi
  done
  [ $found = 1 ] || log "note: no CNI config found under $CLUSTER_DIR/etc/cni/net.d (cannot check pod routes)"
}

# ---------------------------------------------------------------- kubeconfig for kube-router
np_kubeconfig() { # prints the kubeconfig path kube-router should use
  [ -f "$ADMIN_KUBECONFIG" ] || die "no $ADMIN_KUBECONFIG (is the cluster up?)"
  local ca=$CLUSTER_DIR/pki/ca.crt cakey=$CLUSTER_DIR/pki/ca.key kc=$NP_DIR/kube-router.kubeconfig
  if [ ! -f "$ca" ] || [ ! -f "$cakey" ]; then
    log "no cluster CA key at $cakey: kube-router uses $ADMIN_KUBECONFIG"
    echo "$ADMIN_KUBECONFIG"; return 0
  fi
  mkdir -p "$NP_DIR"; chmod 700 "$NP_DIR"
  if [ ! -f "$kc" ] || [ ! -f "$NP_DIR/kube-router.crt" ] ||
     ! openssl verify -CAfile "$ca" "$NP_DIR/kube-router.crt" >/dev/null 2>&1 ||
     ! openssl x509 -checkend 86400 -noout -in "$NP_DIR/kube-router.crt" >/dev/null 2>&1; then
    openssl genrsa -out "$NP_DIR/kube-router.key" 2048 2>/dev/null
    openssl req -new -key "$NP_DIR/kube-router.key" -subj "/CN=system:kube-router" -out "$NP_DIR/kube-router.csr" 2>/dev/null
    printf 'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > "$NP_DIR/kube-router.ext"
    openssl x509 -req -in "$NP_DIR/kube-router.csr" -CA "$ca" -CAkey "$cakey" -CAcreateserial \
      -CAserial "$NP_DIR/ca.srl" -days 365 -sha256 -extfile "$NP_DIR/kube-router.ext" \
      -out "$NP_DIR/kube-router.crt" 2>/dev/null
    local server
    server=$("$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" config view --minify -o jsonpath='{.clusters[0].cluster.server}')
    [ -n "$server" ] || die "cannot read the API server URL from $ADMIN_KUBECONFIG"
    "$KUBECTL" --kubeconfig "$kc" config set-cluster local --server="$server" --certificate-authority="$ca" --embed-certs=true >/dev/null
    "$KUBECTL" --kubeconfig "$kc" config set-credentials system:kube-router \
      --client-certificate="$NP_DIR/kube-router.crt" --client-key="$NP_DIR/kube-router.key" --embed-certs=true >/dev/null
    "$KUBECTL" --kubeconfig "$kc" config set-context default --cluster=local --user=system:kube-router >/dev/null
    "$KUBECTL" --kubeconfig "$kc" config use-context default >/dev/null
    chmod 600 "$kc" "$NP_DIR/kube-router.key"
  fi
  "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" apply -f "$HERE/networkpolicy/kube-router-rbac.yaml" >/dev/null ||
    die "cannot apply kube-router RBAC"
  echo "$kc"
}

# ---------------------------------------------------------------- kube-router process
np_kr_pid() { # prints the pid if the kube-router we started is running
  [ -f "$KR_PID" ] && [ -f "$KR_EXE" ] || return 1
  local pid exe; pid=$(cat "$KR_PID")
  [ -n "$pid" ] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  # "... (deleted)": still our process, but `build` replaced the binary since it started
  [ "$exe" = "$(cat "$KR_EXE")" ] || [ "$exe" = "$(cat "$KR_EXE") (deleted)" ] || return 1
  echo "$pid"
}

np_metric() { # name -> value (sum over series) or empty
  curl -s --max-time 2 "http://127.0.0.1:$KR_METRICS_PORT/metrics" 2>/dev/null |
    awk -v m="$1" '$1 == m || index($1, m"{") == 1 { s += $2; f = 1 } END { if (f) print s }'
}

np_kr_ready() {
  np_kr_pid >/dev/null || return 1
  [ "$(curl -s --max-time 2 "http://127.0.0.1:$KR_METRICS_PORT/healthz" 2>/dev/null)" = OK ] || return 1
  local n; n=$(np_metric kube_router_controller_iptables_sync_time_count)
  [ -n "$n" ] && [ "${n%.*}" -ge 1 ] || return 1
  iptables -S FORWARD 2>/dev/null | grep -q -- '-j KUBE-ROUTER-FORWARD' || return 1
  # a sync that aborts is still counted in the histogram: require no abort in this run's log
  ! grep -q 'Aborting sync' "$KR_LOG"
}

np_kr_start() {
  need_root; np_packages
  [ -x "$KR_BIN" ] || die "$KR_BIN missing (run: $0 build)"
  [ -x "$KUBECTL" ] || die "$KUBECTL missing (is the cluster built?)"
  mkdir -p "$CLUSTER_DIR/run" "$CLUSTER_DIR/log"
  local pid
  if pid=$(np_kr_pid); then
    log "kube-router already running (pid $pid)"
    case $(readlink "/proc/$pid/exe") in *" (deleted)") log "note: its binary was rebuilt since; run down + up to use the new one" ;; esac
    return 0
  fi
  np_kr_cleanup   # start from a clean filter table (leftovers of a killed run, older builds)
  local kc; kc=$(np_kubeconfig)
  "$KUBECTL" --kubeconfig "$kc" get node "$NODE_NAME" -o name >/dev/null ||
    die "node $NODE_NAME not visible with $kc"
  local internal
  internal=$("$KUBECTL" --kubeconfig "$kc" get node "$NODE_NAME" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
  [ -n "$internal" ] || die "node $NODE_NAME has no InternalIP (kube-router matches local pods by status.hostIP == InternalIP)"
  [ "$internal" = "$NODE_IP" ] || log "note: node InternalIP is $internal (NODE_IP=$NODE_IP)"
  if curl -s --max-time 1 "http://127.0.0.1:$KR_METRICS_PORT/" >/dev/null 2>&1; then
    die "127.0.0.1:$KR_METRICS_PORT is already in use (set KR_METRICS_PORT)"
  fi
  [ -f "$KR_LOG" ] && mv -f "$KR_LOG" "$KR_LOG.1"
  local t0; t0=$(date +%s%N)
  # --health-port=0: its health server can only bind all interfaces; /healthz is also served on the
  # metrics listener, which we bind to 127.0.0.1.
  # kube-router looks the Node up by $NODE_NAME first, then hostname, then --hostname-override
  env NODE_NAME="$NODE_NAME" setsid nohup "$KR_BIN" \
      --kubeconfig="$kc" --hostname-override="$NODE_NAME" \
      --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
      --enable-ipv4=true --enable-ipv6=false \
      --service-cluster-ip-range="$SVC_CIDR" \
      --iptables-sync-period="$KR_SYNC_PERIOD" --cache-sync-timeout=2m \
      --health-port=0 --metrics-addr=127.0.0.1 --metrics-port="$KR_METRICS_PORT" \
      --v="${KR_V:-1}" > "$KR_LOG" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid" > "$KR_PID"
  readlink -f "$KR_BIN" > "$KR_EXE"
  for _ in $(seq 1 100); do   # setsid/nohup exec into kube-router: wait until /proc/PID/exe shows it
    np_kr_pid >/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  log "started kube-router pid $(cat "$KR_PID") (log $KR_LOG)"
  for _ in $(seq 1 $((KR_READY_TIMEOUT * 5))); do
    if np_kr_ready; then
      log "kube-router ready after $(( ($(date +%s%N) - t0) / 1000000 ))ms"
      return 0
    fi
    if ! np_kr_pid >/dev/null; then
      tail -n 30 "$KR_LOG" >&2 || true
      die "kube-router exited during start-up (log: $KR_LOG)"
    fi
    sleep 0.2
  done
  tail -n 30 "$KR_LOG" >&2 || true
  die "kube-router not ready after ${KR_READY_TIMEOUT}s (log: $KR_LOG)"
}

np_kr_stop() {
  local pid
  if pid=$(np_kr_pid); then
    kill -TERM "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && { log "kube-router pid $pid ignored SIGTERM, killing"; kill -KILL "$pid" || true; }
    log "stopped kube-router pid $pid"
  fi
  rm -f "$KR_PID" "$KR_EXE"
}

# kube-router --cleanup-config does not remove the network-policy rules in v2.1.0: it calls
# Cleanup() on a zero-value NetworkPolicyController whose iptables/ipset handler maps are nil (so it
# loops over nothing), and it also flushes every IPVS service. Clean up ourselves instead.
np_kr_cleanup() {
  command -v iptables-save >/dev/null || return 0
  local re='KUBE-ROUTER-(INPUT|FORWARD|OUTPUT)|KUBE-NWPLCY-|KUBE-POD-FW-' rules
  # Saved first: `iptables-save | grep -q` fails under pipefail when grep exits at the first match.
  rules=$(iptables-save -t filter)
  if grep -Eq -- "$re" <<<"$rules"; then
    grep -Ev -- "$re" <<<"$rules" | iptables-restore -w 5 -T filter ||
      die "iptables-restore failed while removing kube-router chains"
    log "removed kube-router iptables chains"
  fi
  if command -v ipset >/dev/null; then
    local s n=0
    for s in $(ipset list -n 2>/dev/null | grep -E '^(KUBE-SRC-|KUBE-DST-)' || true); do
      if ipset destroy "$s"; then n=$((n + 1)); else log "could not destroy ipset $s"; fi
    done
    [ $n = 0 ] || log "destroyed $n kube-router ipsets"
  fi
}

np_status() {
  local pid
  if pid=$(np_kr_pid); then
    echo "kube-router: running pid $pid, healthz=$(curl -s --max-time 2 "http://127.0.0.1:$KR_METRICS_PORT/healthz" || echo down)," \
         "syncs=$(np_metric kube_router_controller_iptables_sync_time_count)"
  else
    echo "kube-router: not running"
  fi
  local n
  for n in outside gitlab gitlab-alt; do
    if [ -f "$CLUSTER_DIR/run/netpol-http-$n.pid" ] && kill -0 "$(cat "$CLUSTER_DIR/run/netpol-http-$n.pid")" 2>/dev/null; then
      echo "http $n: running pid $(cat "$CLUSTER_DIR/run/netpol-http-$n.pid")"
    else
      echo "http $n: not running"
    fi
  done
  if command -v iptables >/dev/null; then
    if np_fwd_ok; then echo "$POD_FORWARD_CHAIN opened for $OUTSIDE_CIDR: yes"; else echo "$POD_FORWARD_CHAIN opened for $OUTSIDE_CIDR: no"; fi
  fi
}

cmd=${1:-}
case "$cmd" in
  build) np_build ;;
  up)
    need_root
    np_packages
    np_build
    np_net_up
    np_kr_start
    ;;
  down)
    need_root
    np_kr_stop
    np_kr_cleanup
    np_net_down
    ;;
  enforcement-down)
    # Only kube-router and its rules go; the outside world stays: pods reach everything, as on a
    # node whose policy controller crashed. `up` restores it.
    need_root
    np_kr_stop
    np_kr_cleanup
    ;;
  net-up) np_net_up ;;
  net-down) np_net_down ;;
  ensure-net) need_root; np_ensure_fwd ;;
  status) np_status ;;
  *) echo "usage: $0 build|up|down|enforcement-down|status|net-up|net-down|ensure-net" >&2; exit 2 ;;
esac
