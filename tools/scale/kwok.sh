#!/usr/bin/env bash
# kwok.sh: simulated nodes for the control-plane scale bench (tools/scale, make bench-scale).
#
#   kwok.sh build   build the kwok controller (sigs.k8s.io/kwok, $KWOK_VERSION) into $CLUSTER_BIN
#   kwok.sh up      build if needed, start kwok against the local kube-apiserver (admin kubeconfig)
#                   and create $KWOK_NODES fake nodes kwok-node-0.. ; wait until they are Ready
#   kwok.sh down    delete the fake nodes, stop kwok (by its PID file)
#
# kwok plays the kubelet of nodes that do not exist: it marks their pods Running/Ready with an IP
# and deletes them when asked, so the real apiserver, etcd, scheduler and agent-sandbox controller
# carry the whole load of thousands of sandboxes, and no container ever runs.
#
# Fake nodes carry the label $KWOK_NODE_LABEL and the taint $KWOK_TAINT: NoSchedule, so real
# workloads never land on them; the bench's pods select and tolerate them. Their addresses come
# from 198.18.0.0/15 (RFC 2544, benchmarking): node IP 198.19.0.1, pod CIDR 198.18.<n>.0/24 per
# node, far from the real pod CIDR; kube-router ignores their pods (hostIP is not this node).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/cluster/lib.sh"

KWOK_VERSION=v0.8.0
KWOK_NODES=${KWOK_NODES:-20}
KWOK_NODE_LABEL_KEY=sandbox-executor.local/kwok
KWOK_NODE_LABEL="$KWOK_NODE_LABEL_KEY=true"
KWOK_TAINT_KEY=kwok.x-k8s.io/node
KWOK_NODE_IP=198.19.0.1
KWOK_DIR=$CLUSTER_DIR/kwok

build() {
  ensure_dirs
  go_env
  if stamp_matches "$CLUSTER_BIN/.kwok.version" "$KWOK_VERSION" && [[ -x $CLUSTER_BIN/kwok ]]; then
    log "kwok $KWOK_VERSION: up to date"
    return 0
  fi
  # kwok's go.mod has no replace directives, so `go install module@version` builds it as is.
  if ! GOBIN=$CLUSTER_BIN go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" \
    >"$CLUSTER_LOG/build-kwok.log" 2>&1; then
    tail -n 30 "$CLUSTER_LOG/build-kwok.log" >&2
    die "build of kwok failed (log: $CLUSTER_LOG/build-kwok.log)"
  fi
  stamp_write "$CLUSTER_BIN/.kwok.version" "$KWOK_VERSION"
  log "built kwok $KWOK_VERSION"
}

# The stages (node and pod lifecycles) ship with the module; kwokctl embeds the same "fast" set.
write_config() {
  local m s
  m=$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")/kustomize/stage
  mkdir -p "$KWOK_DIR"
  {
    for s in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
      pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      echo ---
      cat "$m/$s"
    done
  } >"$KWOK_DIR/kwok.yaml"
}

nodes_manifest() {
  local i
  for ((i = 0; i < KWOK_NODES; i++)); do
    cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  labels: {$KWOK_NODE_LABEL_KEY: "true", kubernetes.io/hostname: kwok-node-$i}
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
spec:
  podCIDR: 198.18.$i.0/24
  podCIDRs: [198.18.$i.0/24]
  taints: [{key: $KWOK_TAINT_KEY, value: fake, effect: NoSchedule}]
YAML
  done
}

nodes_ready() {
  local n
  n=$(kubectl_admin get nodes -l "$KWOK_NODE_LABEL" \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -cx True) || true
  ((n == KWOK_NODES))
}

up() {
  ((KWOK_NODES >= 1 && KWOK_NODES <= 250)) || die "KWOK_NODES must be 1..250 (one /24 of 198.18.0.0/16 each)"
  build
  write_config
  # WARN: at INFO kwok logs every status patch it makes. The lease duration must be given: without
  # it this kwok renews no node Lease, and the node lifecycle controller marks the nodes (and
  # their pods) NotReady after its grace period.
  start_daemon kwok "$CLUSTER_BIN/kwok" --kubeconfig "$ADMIN_KUBECONFIG" --config "$KWOK_DIR/kwok.yaml" \
    --manage-nodes-with-label-selector "$KWOK_NODE_LABEL" --node-ip "$KWOK_NODE_IP" \
    --node-lease-duration-seconds 40 --v=WARN
  nodes_manifest | kubectl_admin apply -f - >/dev/null
  wait_until "$KWOK_NODES kwok nodes Ready" 120 nodes_ready
}

pods_on_fake_nodes() {
  kubectl_admin get pods -A -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c '^kwok-node-' || true
}
no_pods_on_fake_nodes() { (($(pods_on_fake_nodes) == 0)); }

down() {
  # kwok must outlive the pods on its nodes: it is what finalizes their deletion (a pod left on a
  # deleted node waits minutes for the pod GC). The bench deletes its namespace before this runs.
  if daemon_running kwok && ! no_pods_on_fake_nodes; then
    wait_until "pods on kwok nodes gone" 300 no_pods_on_fake_nodes || warn "$(pods_on_fake_nodes) pods still on kwok nodes"
  fi
  kubectl_admin delete nodes -l "$KWOK_NODE_LABEL" --ignore-not-found --wait=false >/dev/null ||
    warn "could not delete the kwok nodes: kubectl delete nodes -l $KWOK_NODE_LABEL"
  stop_daemon kwok 10
}

main() {
  case ${1:-} in
    build) build ;;
    up) up ;;
    down) down ;;
    *) die "usage: kwok.sh build|up|down" ;;
  esac
}

run_main "$@"
