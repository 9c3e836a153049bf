#!/usr/bin/env bash
# dns.sh: cluster DNS (CoreDNS, built by build.sh, packed by images.sh) as a Deployment in
# kube-system behind the kube-dns Service at $CLUSTER_DNS_IP, the address the kubelet hands pods.
#
#   dns.sh up     apply manifests/coredns.yaml, wait until the Deployment is available and
#                 kube-proxy routes the Service
#   dns.sh down   delete it (the next up applies it again)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

manifest() {
  local image
  image=$(cat "$CLUSTER_IMAGES/coredns.ref") || die "no CoreDNS image built (images.sh build)"
  sed -e "s|@COREDNS_IMAGE@|$image|g" -e "s|@CLUSTER_DNS_IP@|$CLUSTER_DNS_IP|g" \
    -e "s|@CLUSTER_DOMAIN@|$CLUSTER_DOMAIN|g" "$CLUSTER_SCRIPTS_DIR/manifests/coredns.yaml"
}

# dns_routed: kube-proxy has written the UDP rule of the kube-dns Service.
dns_routed() { iptables -t nat -S KUBE-SERVICES | grep -qF '"kube-system/kube-dns:dns cluster IP"'; }

main() {
  case ${1:-} in
    up)
      manifest | kubectl_admin apply -f - >/dev/null
      kubectl_admin -n kube-system rollout status deployment/coredns --timeout=120s >/dev/null
      wait_until "kube-dns Service routed" 30 dns_routed
      log "cluster DNS $CLUSTER_DNS_IP ($CLUSTER_DOMAIN): CoreDNS $COREDNS_VERSION"
      ;;
    down) manifest | kubectl_admin delete --ignore-not-found -f - >/dev/null ;;
    *) die "usage: dns.sh up|down" ;;
  esac
}

run_main "$@"
