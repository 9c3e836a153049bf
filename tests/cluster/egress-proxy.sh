#!/usr/bin/env bash
# egress-proxy.sh: the local cluster's egress proxy (cmd/sandbox-egress-proxy) for pool duo-proxied.
#
#   egress-proxy.sh up       build it, create netns sbx-egress (10.99.2.2), (re)start it when its
#                            binary or config changed, wait for its health endpoint (idempotent)
#   egress-proxy.sh down     stop it (by PID file) and remove the namespace
#   egress-proxy.sh status
#
# It runs in a network namespace rather than as a pod, at one fixed address that the proxied
# template's HTTP_PROXY and NetworkPolicy (an ipBlock) name; it predates kube-proxy and cluster
# DNS here, which would now let it run as the chart's Deployment behind a Service (not done yet). The namespace sits next to "the
# GitLab instance" (10.99.1.2) and "the internet" (10.99.0.2) of networkpolicy.sh, inside the
# 10.99.0.0/16 that networkpolicy.sh opens for pods in net.sh's guard chain. Production runs the
# same binary as a Deployment (the chart's egressProxy.enabled). Config: deploy/local/egress-proxy.toml.
# Decisions (JSON lines) go to $CLUSTER_LOG/egress-proxy.log.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NS=sbx-egress
HOSTIF=sbx-eg0
HOST_IP=10.99.2.1
PROXY_IP=10.99.2.2
ADMIN_URL=https://$PROXY_IP:3129
ADMIN_CA=$REPO_ROOT/deploy/local/egress-admin-ca.crt
CONFIG=$REPO_ROOT/deploy/local/egress-proxy.toml
BIN=$CLUSTER_BIN/sandbox-egress-proxy
NAME=egress-proxy
STAMP=$CLUSTER_RUN/$NAME.stamp

build() {
  go_env
  local tmp
  tmp=$(mktemp "$CLUSTER_BIN/.sandbox-egress-proxy.XXXXXX")
  (cd "$REPO_ROOT" && go build -trimpath -ldflags '-s -w' -o "$tmp" ./cmd/sandbox-egress-proxy) >>"$CLUSTER_LOG/build-egress-proxy.log" 2>&1 ||
    { tail -n 20 "$CLUSTER_LOG/build-egress-proxy.log" >&2; die "building the egress proxy failed (log: $CLUSTER_LOG/build-egress-proxy.log)"; }
  # Replace the binary only when it changed: a running proxy keeps its file.
  if cmp -s "$tmp" "$BIN"; then rm -f "$tmp"; else mv -f "$tmp" "$BIN"; fi
}

start() {
  local want pid
  want=$({ echo "$CONFIG"; cat "$BIN" "$CONFIG" "$REPO_ROOT"/deploy/local/egress-admin-tls.*; } | sha256sum | cut -c1-16)
  if daemon_running "$NAME" && stamp_matches "$STAMP" "$want"; then
    log "$NAME already running (pid $(daemon_pid "$NAME"))"
    return 0
  fi
  stop_daemon "$NAME"
  "$BIN" -config "$CONFIG" -check >/dev/null
  [[ -f $CLUSTER_LOG/$NAME.log ]] && mv -f "$CLUSTER_LOG/$NAME.log" "$CLUSTER_LOG/$NAME.log.1"
  # `ip netns exec` execs the proxy: the PID file then names the proxy itself (lib.sh daemon_pid).
  setsid ip netns exec "$NS" "$BIN" -config "$CONFIG" >"$CLUSTER_LOG/$NAME.log" 2>&1 </dev/null &
  pid=$!
  readlink -f "$BIN" >"$CLUSTER_RUN/$NAME.exe"
  echo "$pid" >"$(pid_file "$NAME")"
  stamp_write "$STAMP" "$want"
  wait_until "$NAME health" 10 http_get --cacert "$ADMIN_CA" "$ADMIN_URL/healthz" ||
    { tail -n 5 "$CLUSTER_LOG/$NAME.log" >&2; die "$NAME did not start (log $CLUSTER_LOG/$NAME.log)"; }
  log "started $NAME (pid $pid): proxy $PROXY_IP:3128, admin $ADMIN_URL, decisions in $CLUSTER_LOG/$NAME.log"
}

down() {
  stop_daemon "$NAME"
  rm -f "$STAMP"
  ip netns del "$NS" 2>/dev/null || true
  ip link del "$HOSTIF" 2>/dev/null || true
}

main() {
  case ${1:-} in
    up) ensure_dirs; build; netns_veth "$NS" "$HOSTIF" "$HOST_IP" "$PROXY_IP"; start ;;
    down) down ;;
    status)
      if daemon_running "$NAME"; then echo "$NAME: running pid $(daemon_pid "$NAME"), health $(http_get --cacert "$ADMIN_CA" "$ADMIN_URL/healthz" || echo down)"; else echo "$NAME: not running"; fi
      ;;
    *) die "usage: egress-proxy.sh up|down|status" ;;
  esac
}

run_main "$@"
