#!/usr/bin/env bash
# down.sh: stop the local cluster; with --wipe also delete its state.
#
#   tests/cluster/down.sh          stop every daemon we started (by PID file), the pods' shims
#                                  and gVisor sandboxes, unmount; state is kept, so the next
#                                  up.sh is quick and finds the same objects (make cluster-down)
#   tests/cluster/down.sh --wipe   also delete etcd, containerd, kubelet, CNI and PKI state and
#                                  the node network; keeps bin/, build/, images/ and log/
#                                  (and the Go caches), so the next up.sh builds nothing
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

D=$CLUSTER_SCRIPTS_DIR
NETWORKPOLICY=$D/networkpolicy.sh
# libcni's result cache: the one record of which network namespaces our CNI network created.
CNI_CACHE=/var/lib/cni/results
CNI_NETWORK=sandbox-executor

# Network namespaces of our pods (containerd names them /run/netns/cni-*). After a plain down the
# restarted containerd tears them down itself; after --wipe nothing would, so remove them here.
remove_pod_netns() {
  local f ns id n=0
  for f in "$CNI_CACHE/$CNI_NETWORK"-*; do
    [[ -f $f ]] || continue
    ns=$(grep -o '"netns":"[^"]*"' "$f" | cut -d'"' -f4) || true
    if [[ $ns == /var/run/netns/cni-* || $ns == /run/netns/cni-* ]]; then
      ip netns delete "$(basename "$ns")" 2>/dev/null && n=$((n + 1))
    fi
    # <network>-<sandbox id>-<ifname>; containerd also caches the sandbox's loopback setup.
    id=${f#"$CNI_CACHE/$CNI_NETWORK"-}
    id=${id%-*}
    rm -f "$f" "$CNI_CACHE/cni-loopback-$id-lo"
  done
  ((n == 0)) || log "removed $n pod network namespace(s)"
}

# kubelet's /var/log/containers symlinks into our pod log directory.
remove_container_log_links() {
  local l
  for l in /var/log/containers/*.log; do
    [[ -L $l && "$(readlink "$l")" == "$CLUSTER_LOG/pods/"* ]] && rm -f "$l"
  done
  return 0
}

wipe_state() {
  remove_pod_netns
  remove_container_log_links
  # kube-proxy's KUBE-* chains and rules in the nat and filter tables.
  if [[ -x $CLUSTER_BIN/kube-proxy ]]; then
    "$CLUSTER_BIN/kube-proxy" --cleanup >"$CLUSTER_LOG/kube-proxy-cleanup.log" 2>&1 || warn "kube-proxy --cleanup failed (log: $CLUSTER_LOG/kube-proxy-cleanup.log)"
  fi
  "$D/net.sh" down
  # Build caches (bin, build, images) and component logs stay; pod logs belong to gone pods.
  rm -rf "${CLUSTER_DIR:?}"/{etcd,containerd,kubelet,cni,agent-sandbox,pki,kubeconfig,etc,run} "$CLUSTER_LOG/pods"
  log "wiped state in $CLUSTER_DIR (kept bin/ build/ images/ log/)"
}

main() {
  local wipe=0
  case ${1:-} in
    "") ;;
    --wipe) wipe=1 ;;
    *) die "usage: down.sh [--wipe]" ;;
  esac
  [[ -d $CLUSTER_DIR ]] || { log "nothing to stop: $CLUSTER_DIR does not exist"; return 0; }
  mkdir -p "$CLUSTER_RUN"
  local start
  start=$(now_ms)
  if [[ -x $NETWORKPOLICY ]]; then
    "$NETWORKPOLICY" down || warn "networkpolicy.sh down failed"
  fi
  "$D/egress-proxy.sh" down || warn "egress-proxy.sh down failed"
  "$D/start.sh" stop kubelet kube-proxy
  # The in-cluster agent-sandbox controller and CoreDNS stop with the node's pods.
  "$D/start.sh" stop containerd
  "$D/start.sh" stop scheduler controller-manager apiserver
  # A controller that an earlier version of these scripts ran on the node.
  "$D/agent-sandbox.sh" down
  "$D/start.sh" stop etcd
  ((wipe == 0)) || wipe_state
  log "cluster down in $(fmt_ms $(($(now_ms) - start)))"
}

run_main "$@"
