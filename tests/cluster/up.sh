#!/usr/bin/env bash
# up.sh: bring the local single-node cluster up, from nothing or from any partial state.
#
#   tests/cluster/up.sh          (make cluster-up)
#
# Idempotent: builds are skipped when the pinned versions are built, images when current,
# running daemons are left alone. Every step is timed; a summary is printed at the end.
# State lives in $CLUSTER_DIR (default ~/.cache/sandbox-executor/cluster); see README.md here.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

D=$CLUSTER_SCRIPTS_DIR
NETWORKPOLICY=$D/networkpolicy.sh

# The chart users install (deploy/chart), with the local cluster's values (deploy/local/values.yaml).
apply_deploy() {
  [[ -f $DEPLOY_DIR/values.yaml ]] || die "no values.yaml in $DEPLOY_DIR (the local cluster's chart values)"
  local agent_ref helm version
  agent_ref=$(cat "$CLUSTER_IMAGES/agent.ref") || die "no agent image built"
  make -s --no-print-directory -C "$REPO_ROOT" helm >&2
  helm=$(make -s --no-print-directory -C "$REPO_ROOT" helm-path)
  # The agent image's tag is its content hash: a new agent changes the template, and the warm
  # pools (updateStrategy Recreate) replace their unclaimed pods. The server's version is what
  # helm install would see (images.agentVolume auto reads it).
  version=$(kubectl_admin version -o json | sed -n 's/^ *"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -n 1)
  [[ -n $version ]] || die "cannot read the API server's version"
  "$helm" template "$EXECUTOR_NAMESPACE" "$REPO_ROOT/deploy/chart/sandbox-executor" --namespace "$EXECUTOR_NAMESPACE" \
    -f "$DEPLOY_DIR/values.yaml" --set "images.agent=$agent_ref" --kube-version "$version" | kubectl_admin apply -f -
}

# apply_agent_ca: the job pods' trust in the executors (ConfigMap sandbox-executor-agent-ca,
# key ca.crt, which the templates put into SANDBOX_EXECUTOR_AGENT_CLIENT_CA), before the pools
# start pods that read it.
apply_agent_ca() {
  kubectl_admin create namespace "$EXECUTOR_NAMESPACE" --dry-run=client -o yaml | kubectl_admin apply -f - >/dev/null
  kubectl_admin -n "$EXECUTOR_NAMESPACE" create configmap sandbox-executor-agent-ca \
    --from-file=ca.crt="$CLUSTER_PKI/agent-ca.crt" --dry-run=client -o yaml | kubectl_admin apply -f - >/dev/null
}

# prune_test_namespaces: a suite deletes the namespaces it made when it ends; a killed run (make
# check stopped, CI's time limit) leaves them, and their warm pools' gVisor pods would take CPU
# from every later suite. They carry the label tests/harness/chartinstall.TestNamespaceLabel.
prune_test_namespaces() {
  local left
  left=$(kubectl_admin get namespaces -l sandbox-executor.gitlab.io/test -o name)
  [[ -n $left ]] || return 0
  log "deleting namespaces a killed test run left: ${left//$'\n'/ }"
  kubectl_admin delete namespaces -l sandbox-executor.gitlab.io/test --wait=true --timeout=300s >/dev/null
}

apply_runtimeclass() { kubectl_admin apply -f "$D/manifests/runtimeclass.yaml" >/dev/null; }

finish() {
  local rc=$?
  print_step_summary
  rm -f "$STEP_SUMMARY_FILE"
  if ((rc == 0)); then
    log "cluster up in $(fmt_ms $(($(now_ms) - UP_START))): admin kubeconfig $ADMIN_KUBECONFIG, executor kubeconfig $EXECUTOR_KUBECONFIG"
  else
    log "up.sh FAILED (exit $rc) after $(fmt_ms $(($(now_ms) - UP_START))); logs in $CLUSTER_LOG"
  fi
}

main() {
  UP_START=$(now_ms)
  # Every script's steps (each component built, each image) go to one summary (lib.sh's step).
  export STEP_SUMMARY_FILE
  STEP_SUMMARY_FILE=$(mktemp)
  trap finish EXIT
  ensure_dirs
  step "host packages" "$D/deps.sh"
  step "build binaries" "$D/build.sh" all
  step "build images" "$D/images.sh" build
  step "node network" "$D/net.sh" up
  step "certificates" "$D/certs.sh" pki
  step "configs" "$D/configs.sh"
  step "etcd" "$D/start.sh" start etcd
  step "kube-apiserver" "$D/start.sh" start apiserver
  step "kube-controller-manager" "$D/start.sh" start controller-manager
  step "kube-scheduler" "$D/start.sh" start scheduler
  step "containerd" "$D/start.sh" start containerd
  step "import images" "$D/images.sh" import
  step "kubelet" "$D/start.sh" start kubelet
  step "kube-proxy" "$D/start.sh" start kube-proxy
  step "runtimeclass gvisor" apply_runtimeclass
  if [[ -x $NETWORKPOLICY ]]; then
    step "networkpolicy" "$NETWORKPOLICY" up
  fi
  step "cluster DNS" "$D/dns.sh" up
  step "egress proxy" "$D/egress-proxy.sh" up
  step "agent-sandbox" "$D/agent-sandbox.sh" up
  step "leftover test namespaces" prune_test_namespaces
  step "agent CA" apply_agent_ca
  step "apply the chart (deploy/local/values.yaml)" apply_deploy
  step "warm pool $WARM_POOL ready" wait_until "warm pool $EXECUTOR_NAMESPACE/$WARM_POOL ready" 300 warm_pool_state
  step "executor kubeconfig" "$D/certs.sh" executor-kubeconfig
  step "check" "$D/check.sh"
}

run_main "$@"
