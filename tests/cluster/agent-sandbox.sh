#!/usr/bin/env bash
# agent-sandbox.sh: install agent-sandbox in-cluster from its own release manifests, as users do.
#
#   agent-sandbox.sh up     apply the pinned module's k8s/ kustomization (core + extensions, one
#                           controller Deployment with --extensions) with the controller image
#                           replaced by ours and the replenish delay docs/install.md recommends; wait until the controller is available and has
#                           patched the CRDs' conversion caBundles
#   agent-sandbox.sh down   stop a controller left running on the node by an earlier version of
#                           these scripts (the in-cluster one stops with the node's pods)
#
# The manifests come from the module the controller image is built from (build.sh, images.sh),
# so CRDs and controller always match. Only the image reference changes: upstream's
# `ko://.../agent-sandbox-controller` placeholder becomes our image (imported into containerd
# and pinned; its tag, not :latest, makes the default pull policy IfNotPresent). The CRDs
# convert through the controller's webhook Service, which the apiserver reaches through
# kube-proxy, and the controller reaches the API through the kubernetes Service.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

UPSTREAM_IMAGE=ko://sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
DEPLOYMENT=deployment/agent-sandbox-controller
# The replenish delay docs/install.md recommends (a pool refills 3 s after its last claim, so
# back-to-back jobs do not share the cores with sandbox boots): the local cluster runs as admins
# are told to run theirs. BenchmarkJobsBeforeRefills rolls the controller out without it to compare.
REPLENISH_DELAY_ARG=--sandbox-warm-pool-replenish-delay=3s

release_manifests() {
  local m image
  image=$(cat "$CLUSTER_IMAGES/agent-sandbox-controller.ref") || die "no agent-sandbox controller image built (images.sh build)"
  m=$(module_dir "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION")/k8s
  kubectl_admin kustomize "$m" | sed -e "s|image: $UPSTREAM_IMAGE\b.*|image: $image|" \
    -e "s|^\( *\)- --extensions\$|&\n\1- $REPLENISH_DELAY_ARG|"
}

# The controller once ran on the node (out of cluster, client-certificate user, a selector-less
# webhook Service with an EndpointSlice at the node IP). Remove what that left on a cluster from
# before, or the node IP would stay an endpoint of the webhook Service.
remove_out_of_cluster_leftovers() {
  stop_daemon agent-sandbox 15
  kubectl_admin delete --ignore-not-found clusterrolebinding agent-sandbox-controller-local agent-sandbox-controller-extensions-local >/dev/null
  kubectl_admin -n "$AGENT_SANDBOX_NAMESPACE" delete --ignore-not-found rolebinding/agent-sandbox-controller-local \
    endpointslice/agent-sandbox-webhook-service-node >/dev/null
}

# Every CRD's conversion caBundle is the CA in the controller's certificate Secret (it creates
# the Secret, or reuses it, and patches the CRDs at start).
ca_bundles_patched() {
  local ca n
  ca=$(kubectl_admin -n "$AGENT_SANDBOX_NAMESPACE" get secret agent-sandbox-webhook-certs -o jsonpath='{.data.ca\.crt}')
  [[ -n $ca ]] || return 1
  n=$(kubectl_admin get crd "${AGENT_SANDBOX_CRDS[@]}" \
    -o jsonpath='{range .items[*]}{.spec.conversion.webhook.clientConfig.caBundle}{"\n"}{end}' | grep -cxF "$ca")
  ((n == ${#AGENT_SANDBOX_CRDS[@]}))
}

# The webhook Service has a ready endpoint (the controller pod), so conversion calls find it.
webhook_endpoint_ready() {
  kubectl_admin -n "$AGENT_SANDBOX_NAMESPACE" get endpointslices -l kubernetes.io/service-name=agent-sandbox-webhook-service \
    -o jsonpath='{range .items[*].endpoints[*]}{.conditions.ready}{"\n"}{end}' | grep -qx true
}

up() {
  remove_out_of_cluster_leftovers
  # Server-side: the CRDs are too large for the last-applied annotation, and the caBundle the
  # controller patched in stays untouched (it belongs to another field manager).
  release_manifests | kubectl_admin apply --server-side --force-conflicts -f - >/dev/null
  kubectl_admin wait --for condition=Established --timeout=60s "${AGENT_SANDBOX_CRDS[@]/#/crd/}" >/dev/null
  kubectl_admin -n "$AGENT_SANDBOX_NAMESPACE" rollout status "$DEPLOYMENT" --timeout=180s >/dev/null
  kubectl_admin -n "$AGENT_SANDBOX_NAMESPACE" get "$DEPLOYMENT" -o jsonpath='{.spec.template.spec.containers[0].args}' |
    grep -qF -- "$REPLENISH_DELAY_ARG" || die "the agent-sandbox controller runs without $REPLENISH_DELAY_ARG: its release manifest's args changed"
  wait_until "agent-sandbox webhook endpoint ready" 60 webhook_endpoint_ready
  wait_until "agent-sandbox CRD conversion caBundles" 60 ca_bundles_patched
  log "agent-sandbox $AGENT_SANDBOX_VERSION controller in-cluster ($(cat "$CLUSTER_IMAGES/agent-sandbox-controller.ref"))"
}

main() {
  case ${1:-} in
    up) up ;;
    down) stop_daemon agent-sandbox 15 ;;
    *) die "usage: agent-sandbox.sh up|down" ;;
  esac
}

run_main "$@"
