#!/usr/bin/env bash
# deps.sh: install the Debian packages the cluster needs on the host.
#   runc, containernetworking-plugins  the OCI runtime for runc pods and the CNI bridge/host-local
#                                      plugins (Debian's builds are fine; containerd itself is built)
#   debootstrap                        builds the image root filesystems (no registry here)
#   iptables, ipset                    node-side pod traffic rules (and kube-router's NetworkPolicy);
#                                      agent/netfence's unit tests read their tables back (make unit)
#   gcc, libc6-dev                     the static pause binary
#   curl, openssl, ca-certificates     health probes and the cluster PKI
#   iproute2, util-linux, procps       bridges/routes, setsid/mount, process checks
#   git                                the e2e suite's git server (git http-backend) for job clones and pushes
#   python3                            patching sources before builds, JSON in netpol-check.sh
# apt-get update runs only when something is missing, so a warm up.sh never touches the network.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

HOST_PACKAGES=(runc containernetworking-plugins debootstrap iptables ipset gcc libc6-dev curl tcpdump
  openssl ca-certificates iproute2 util-linux procps tar git python3)

missing_packages() {
  local p
  for p in "${HOST_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}

main() {
  command -v apt-get >/dev/null || die "this tooling needs a Debian host (apt-get)"
  [[ $(id -u) -eq 0 ]] || die "run as root: the cluster needs mounts, bridges and iptables"
  local missing
  mapfile -t missing < <(missing_packages)
  if ((${#missing[@]} == 0)); then
    log "host packages: all present"
    return 0
  fi
  log "installing host packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

run_main "$@"
