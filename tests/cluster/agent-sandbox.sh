#!/usr/bin/env bash
# agent-sandbox.sh: install agent-sandbox (CRDs, RBAC) and run its controller out of cluster.
#
#   agent-sandbox.sh up     apply manifests, start the controller with --extensions, wait ready
#   agent-sandbox.sh down   stop the controller
#
# The manifests come from the pinned module's k8s/ directory (the same source the controller is
# built from), so CRDs and controller always match.
#
# The CRDs use webhook conversion served by the controller on :9443. Out of cluster there is no
# pod behind agent-sandbox-webhook-service, so the Service has no selector and we publish an
# EndpointSlice pointing at the node IP; the apiserver runs with --enable-aggregator-routing so
# it dials that endpoint directly (no kube-proxy). On startup the controller creates its serving
# certificate and patches the CRDs' caBundle; we wait for that before declaring it ready.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

AGENT_SANDBOX_NAMESPACE=agent-sandbox-system
AS_USER=agent-sandbox-controller # CN of its client certificate (certs.sh)

# yaml_docs_of_kind KIND FILE: the documents of one kind from a multi-document YAML file.
yaml_docs_of_kind() {
  awk -v kind="$1" '
    /^---/ { if (keep) printf "---\n%s", doc; doc = ""; keep = 0; next }
    { doc = doc $0 "\n"; if ($0 == "kind: " kind) keep = 1 }
    END { if (keep) printf "---\n%s", doc }' "$2"
}

# The upstream bindings name the in-cluster ServiceAccount; ours name the client-cert user.
access_manifest() {
  cat <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: agent-sandbox-controller-local}
subjects: [{kind: User, name: $AS_USER, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: agent-sandbox-controller, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: agent-sandbox-controller-extensions-local}
subjects: [{kind: User, name: $AS_USER, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: agent-sandbox-controller-extensions, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: agent-sandbox-controller-local, namespace: $AGENT_SANDBOX_NAMESPACE}
subjects: [{kind: User, name: $AS_USER, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: Role, name: agent-sandbox-controller, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: v1
kind: Service
metadata: {name: agent-sandbox-webhook-service, namespace: $AGENT_SANDBOX_NAMESPACE}
spec:
  ports: [{name: webhook, port: 443, targetPort: $AGENT_SANDBOX_WEBHOOK_PORT, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: agent-sandbox-webhook-service-node
  namespace: $AGENT_SANDBOX_NAMESPACE
  labels:
    kubernetes.io/service-name: agent-sandbox-webhook-service
    endpointslice.kubernetes.io/managed-by: sandbox-executor.local
addressType: IPv4
ports: [{name: webhook, port: $AGENT_SANDBOX_WEBHOOK_PORT, protocol: TCP}]
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
YAML
}

# Applied once per agent-sandbox version and etcd: the CRDs alone take seconds to apply.
MANIFESTS_STAMP=$CLUSTER_DIR/agent-sandbox/manifests.version

manifests_current() {
  stamp_matches "$MANIFESTS_STAMP" "$AGENT_SANDBOX_VERSION" &&
    kubectl_admin get "${AGENT_SANDBOX_CRDS[@]/#/crd/}" >/dev/null 2>&1
}

apply_manifests() {
  if manifests_current; then
    log "agent-sandbox $AGENT_SANDBOX_VERSION manifests: already applied"
    return 0
  fi
  local m
  m=$(module_dir "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION")/k8s
  # Server-side: the CRDs are too large for the last-applied annotation, and the caBundle the
  # controller patched in stays untouched (it belongs to another field manager).
  kubectl_admin apply --server-side --force-conflicts -f "$m/crds/" >/dev/null
  {
    kubectl_admin create namespace "$AGENT_SANDBOX_NAMESPACE" --dry-run=client -o yaml
    echo ---
    cat "$m/rbac.generated.yaml"
    echo ---
    cat "$m/extensions-rbac.generated.yaml"
    yaml_docs_of_kind Role "$m/controller.yaml"
    echo ---
    access_manifest
  } | kubectl_admin apply -f - >/dev/null
  kubectl_admin wait --for condition=Established --timeout=60s "${AGENT_SANDBOX_CRDS[@]/#/crd/}" >/dev/null
  mkdir -p "$(dirname "$MANIFESTS_STAMP")"
  stamp_write "$MANIFESTS_STAMP" "$AGENT_SANDBOX_VERSION"
}

ca_bundles_patched() {
  local n
  n=$(kubectl_admin get crd "${AGENT_SANDBOX_CRDS[@]}" \
    -o jsonpath='{range .items[*]}{.spec.conversion.webhook.clientConfig.caBundle}{"\n"}{end}' | grep -c .)
  ((n == ${#AGENT_SANDBOX_CRDS[@]}))
}

controller_ready() { http_get "http://$AGENT_SANDBOX_PROBE_ADDR/readyz" >/dev/null; }

start_controller() {
  mkdir -p "$CLUSTER_DIR/agent-sandbox/certs"
  # No leader election: there is one instance, and a restarted one would otherwise wait for the
  # previous instance's lease to expire.
  DAEMON_ENV=(KUBECONFIG="$CLUSTER_KUBECONFIGS/agent-sandbox.kubeconfig")
  start_daemon agent-sandbox "$CLUSTER_BIN/agent-sandbox-controller" --extensions --leader-elect=false \
    --metrics-bind-address="$AGENT_SANDBOX_METRICS_ADDR" --health-probe-bind-address="$AGENT_SANDBOX_PROBE_ADDR" \
    --webhook-port="$AGENT_SANDBOX_WEBHOOK_PORT" --webhook-cert-dir="$CLUSTER_DIR/agent-sandbox/certs"
  DAEMON_ENV=()
  wait_until "agent-sandbox controller ready" 120 controller_ready
  wait_until "agent-sandbox CRD conversion caBundles" 60 ca_bundles_patched
}

main() {
  case ${1:-} in
    up)
      apply_manifests
      start_controller
      ;;
    down) stop_daemon agent-sandbox 15 ;;
    *) die "usage: agent-sandbox.sh up|down" ;;
  esac
}

run_main "$@"
