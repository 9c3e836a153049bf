#!/usr/bin/env bash
# check.sh: is the local cluster fully usable? One line per component; exits non-zero naming
# every check that failed. Run by up.sh at the end; safe to run any time.
#
#   tests/cluster/check.sh [--no-pods]
#
# The gVisor and DNS checks start three short-lived pods in namespace $CHECK_NAMESPACE (a gVisor
# pod per local image, and a runc pod) instead of exec'ing into warm-pool pods, which must stay
# pristine for CI jobs. --no-pods leaves them out: the suites' whole-cluster checks
# (tests/harness/clusterjobs/whole.go) pair it with netpol-check.sh --enforcement, whose gVisor
# pod of the ci image answers the same gVisor, image and DNS checks; three pods fewer per check
# (a pod's start and end cost the node about 12 CPU-seconds: tests/README.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHECK_NAMESPACE=sandbox-executor-check
FAILED=()

# check NAME CMD...: CMD prints a short detail on stdout; its exit status decides.
check() {
  local name=$1 out rc=0
  shift
  out=$("$@" 2>&1) || rc=$?
  out=$(printf '%s' "$out" | tr '\n' ' ' | cut -c1-110)
  if ((rc == 0)); then
    printf 'ok    %-26s %s\n' "$name" "$out"
  else
    printf 'FAIL  %-26s %s\n' "$name" "$out"
    FAILED+=("$name")
  fi
}

check_etcd() { http_get "$ETCD_METRICS_URL/health" | grep '"health":"true"'; }
check_apiserver() { kubectl_admin get --raw /readyz && echo " $APISERVER_URL"; }
# The aggregation layer (extension API servers such as an External metrics adapter): the
# apiserver publishes its front proxy's CA for them to trust, which it does only when started
# with the requestheader flags (start.sh).
check_aggregation() {
  local ca names
  ca=$(kubectl_admin -n kube-system get configmap extension-apiserver-authentication \
    -o jsonpath='{.data.requestheader-client-ca-file}')
  names=$(kubectl_admin -n kube-system get configmap extension-apiserver-authentication \
    -o jsonpath='{.data.requestheader-allowed-names}')
  [[ $ca == *"BEGIN CERTIFICATE"* ]] || { echo "no requestheader CA: kube-apiserver runs without the front proxy's flags"; return 1; }
  echo "front proxy $names"
}
check_controller_manager() { http_get -k https://127.0.0.1:10257/healthz; }
check_scheduler() { http_get -k https://127.0.0.1:10259/healthz; }
check_containerd() {
  daemon_running containerd || { echo "not running"; return 1; }
  ctr_k8s version | awk '/Server:/ {s = 1} s && /Version:/ {print "server " $2; exit}'
}
check_kubelet() {
  http_get "$KUBELET_HEALTHZ_URL" >/dev/null || { echo "healthz not answering"; return 1; }
  local ready
  ready=$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.nodeInfo.kubeletVersion}')
  echo "node $NODE_NAME Ready=$ready"
  [[ $ready == True* ]]
}
check_images() {
  local ref missing=()
  for ref in "$PAUSE_IMAGE" "$CI_IMAGE" "$POSIX_IMAGE"; do
    [[ -n $(ctr_k8s images ls -q "name==$ref") ]] || missing+=("$ref")
  done
  ((${#missing[@]} == 0)) || { echo "missing: ${missing[*]}"; return 1; }
  echo "pause, ci, posix imported"
}
check_runtimeclass() {
  local handler
  handler=$(kubectl_admin get runtimeclass gvisor -o jsonpath='{.handler}')
  echo "gvisor -> handler $handler"
  [[ $handler == runsc ]]
}
check_kube_proxy() {
  daemon_running kube-proxy || { echo "not running"; return 1; }
  http_get "http://$KUBE_PROXY_HEALTHZ_ADDR/healthz" >/dev/null || { echo "healthz not answering"; return 1; }
  iptables -t nat -S KUBE-SERVICES | grep -qF '"default/kubernetes:https cluster IP"' ||
    { echo "no rule for the kubernetes Service"; return 1; }
  # From the node too: the apiserver calls webhooks at their ClusterIP.
  http_get -k "https://$KUBERNETES_SERVICE_IP/version" >/dev/null ||
    { echo "the node cannot reach the kubernetes Service at $KUBERNETES_SERVICE_IP:443"; return 1; }
  echo "iptables mode, $KUBERNETES_SERVICE_IP:443 answers the node (pid $(daemon_pid kube-proxy))"
}
# deployment_available NAMESPACE NAME: prints "N/M available, image REF".
deployment_available() {
  local want ready image
  read -r want ready image < <(kubectl_admin -n "$1" get deployment "$2" \
    -o jsonpath='{.spec.replicas} {.status.availableReplicas} {.spec.template.spec.containers[0].image}{"\n"}') || true
  [[ -n $want ]] || { echo "deployment $1/$2 not found"; return 1; }
  [[ $ready == [0-9]* ]] || { image=$ready; ready=0; }
  echo "${ready}/$want available, image $image"
  ((want > 0 && ready == want))
}
check_coredns() {
  deployment_available kube-system coredns || return 1
  local ip
  ip=$(kubectl_admin -n kube-system get service kube-dns -o jsonpath='{.spec.clusterIP}')
  echo "service kube-dns $ip"
  [[ $ip == "$CLUSTER_DNS_IP" ]]
}
# The controller runs in-cluster; listing sandboxes at the CRD's other served version makes the
# apiserver convert every stored object through the webhook Service (kube-proxy), so this
# proves the conversion path, not just a running pod.
check_agent_sandbox() {
  deployment_available "$AGENT_SANDBOX_NAMESPACE" agent-sandbox-controller || return 1
  local n
  n=$(kubectl_admin get sandboxes.v1alpha1.agents.x-k8s.io -A --no-headers 2>&1 | grep -vc '^No resources') ||
    { kubectl_admin get sandboxes.v1alpha1.agents.x-k8s.io -A 2>&1 | tail -n 1; return 1; }
  echo ", $n sandbox(es) converted to v1alpha1 through the webhook"
}
check_crds() {
  local established
  established=$(kubectl_admin get crd "${AGENT_SANDBOX_CRDS[@]}" \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Established")].status}{"\n"}{end}' | grep -cx True)
  echo "$established/${#AGENT_SANDBOX_CRDS[@]} established"
  ((established == ${#AGENT_SANDBOX_CRDS[@]}))
}
check_executor_kubeconfig() {
  local who
  who=$("$CLUSTER_BIN/kubectl" --kubeconfig "$EXECUTOR_KUBECONFIG" auth whoami -o jsonpath='{.status.userInfo.username}')
  echo "$who"
  [[ $who == "system:serviceaccount:$EXECUTOR_NAMESPACE:$EXECUTOR_SERVICEACCOUNT" ]]
}

# --- gVisor pods ------------------------------------------------------------------------------
check_pod_manifest() { # NAME IMAGE [RUNTIMECLASS]
  cat <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $CHECK_NAMESPACE
  labels: {app.kubernetes.io/name: cluster-check}
spec:
  ${3:+runtimeClassName: $3}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  activeDeadlineSeconds: 300
  restartPolicy: Never
  containers:
  - name: main
    image: $2
    imagePullPolicy: Never
    command: ["sleep", "300"]
YAML
}

POSIX_POD=gvisor-posix-$$
CI_POD=gvisor-ci-$$
RUNC_POD=runc-posix-$$
# Created first and awaited last, so the sandboxes boot while the other checks run.
create_check_pods() {
  kubectl_admin create namespace "$CHECK_NAMESPACE" --dry-run=client -o yaml | kubectl_admin apply -f - >/dev/null
  # Leftovers of an interrupted earlier run, once their activeDeadlineSeconds has ended them;
  # the pods of a check.sh running at the same time (a shared machine) are left alone.
  kubectl_admin -n "$CHECK_NAMESPACE" delete pod -l app.kubernetes.io/name=cluster-check \
    --field-selector=status.phase!=Running,status.phase!=Pending --wait=false >/dev/null 2>&1 || true
  # Pods are rejected until the namespace's default ServiceAccount exists.
  wait_until "ServiceAccount $CHECK_NAMESPACE/default" 30 kubectl_admin -n "$CHECK_NAMESPACE" get serviceaccount default 2>/dev/null
  {
    check_pod_manifest "$POSIX_POD" "$POSIX_IMAGE" gvisor
    echo ---
    check_pod_manifest "$CI_POD" "$CI_IMAGE" gvisor
    echo ---
    check_pod_manifest "$RUNC_POD" "$POSIX_IMAGE"
  } |
    kubectl_admin apply -f - >/dev/null
}
wait_check_pods() {
  kubectl_admin -n "$CHECK_NAMESPACE" wait --for=condition=Ready --timeout=90s "pod/$POSIX_POD" "pod/$CI_POD" "pod/$RUNC_POD" >/dev/null
}
stop_check_pods() {
  kubectl_admin -n "$CHECK_NAMESPACE" delete pod "$POSIX_POD" "$CI_POD" "$RUNC_POD" --wait=false --ignore-not-found >/dev/null 2>&1 || true
}

# The kernel a gVisor sandbox reports is gVisor's own ("4.4.0-gvisor"-like), and its dmesg
# starts with "Starting gVisor...": proof the pod is not a runc container.
check_gvisor_posix() {
  local out
  out=$(kubectl_admin -n "$CHECK_NAMESPACE" exec "$POSIX_POD" -- /bin/sh -c \
    'uname -r; dmesg | head -n 1; if command -v bash >/dev/null 2>&1; then echo "bash present"; else echo "no bash"; fi')
  echo "$out"
  grep -q gvisor <<<"$out" && grep -q 'Starting gVisor' <<<"$out" && grep -qx 'no bash' <<<"$out"
}
check_gvisor_ci() { pod_ci_image_report "$CHECK_NAMESPACE" "$CI_POD"; }
check_dns() { pod_dns_report "$CHECK_NAMESPACE" "$1"; }

main() {
  local pods=1 pods_out pods_rc=0
  case ${1:-} in
    "") ;;
    --no-pods) pods=0 ;;
    *) echo "usage: $0 [--no-pods]" >&2; return 2 ;;
  esac
  if ((pods)); then
    trap stop_check_pods EXIT
    pods_out=$(create_check_pods 2>&1) || pods_rc=$?
  fi
  check "etcd" check_etcd
  check "kube-apiserver" check_apiserver
  check "aggregation layer" check_aggregation
  check "kube-controller-manager" check_controller_manager
  check "kube-scheduler" check_scheduler
  check "containerd" check_containerd
  check "kubelet / node Ready" check_kubelet
  check "images" check_images
  check "runtimeclass gvisor" check_runtimeclass
  check "kube-proxy" check_kube_proxy
  check "cluster DNS (CoreDNS)" check_coredns
  check "agent-sandbox controller" check_agent_sandbox
  check "agent-sandbox CRDs" check_crds
  check "warm pool" warm_pool_state
  check "executor kubeconfig" check_executor_kubeconfig
  if ((!pods)); then
    echo "skip  gVisor pods                (--no-pods: netpol-check.sh --enforcement's pod proves them)"
  elif ((pods_rc == 0)) && pods_out=$(wait_check_pods 2>&1); then
    check "gVisor pod (posix image)" check_gvisor_posix
    check "gVisor pod (ci image)" check_gvisor_ci
    check "DNS from a gVisor pod" check_dns "$POSIX_POD"
    check "DNS from a runc pod" check_dns "$RUNC_POD"
  else
    printf 'FAIL  %-26s %s\n' "gVisor pods" "$(tail -n 2 <<<"$pods_out" | tr '\n' ' ')"
    FAILED+=("gVisor pods")
  fi
  if ((${#FAILED[@]})); then
    local joined
    joined=$(printf '%s, ' "${FAILED[@]}")
    printf 'FAILED: %s\n' "${joined%, }"
    return 1
  fi
  echo "all checks passed"
}

run_main "$@"
