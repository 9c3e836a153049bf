#!/usr/bin/env bash
# certs.sh: the cluster's PKI and kubeconfigs.
#
#   certs.sh pki                  CA + component certificates + their kubeconfigs, the front
#                                 proxy's CA and client certificate (idempotent; regenerated
#                                 when NODE_NAME or NODE_IP changed)
#   certs.sh executor-kubeconfig  $EXECUTOR_KUBECONFIG for the sandbox-executor ServiceAccount,
#                                 with a fresh 48h token (needs deploy/local applied)
#
# All kubeconfigs embed their CA and credentials, so they can be copied anywhere.
# Certificate CNs must stay <= 64 characters (X.509 ub-common-name).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

EXECUTOR_TOKEN_DURATION=48h
CERT_DAYS=3650

b64() { base64 -w0 "$1"; }

make_ca() {
  [[ -f $CLUSTER_PKI/ca.key && -f $CLUSTER_PKI/ca.crt ]] && return 0
  openssl genrsa -out "$CLUSTER_PKI/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$CLUSTER_PKI/ca.key" -subj "/CN=sandbox-executor-local-ca" -days "$CERT_DAYS" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$CLUSTER_PKI/ca.crt" 2>/dev/null
}

# make_agent_ca: the agent CA of the executors that run jobs on this cluster (docs/security.md):
# ECDSA P-256, as `sandbox-executor tls init` makes it. The executor's config names both files;
# the job pods trust the certificate (ConfigMap sandbox-executor-agent-ca, up.sh).
make_agent_ca() {
  local p=$CLUSTER_PKI
  [[ -f $p/agent-ca.key && -f $p/agent-ca.crt ]] && return 0
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$p/agent-ca.key" 2>/dev/null
  chmod 600 "$p/agent-ca.key"
  openssl req -x509 -new -key "$p/agent-ca.key" -subj "/CN=sandbox-executor-local-agent-ca" -days "$CERT_DAYS" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign" \
    -out "$p/agent-ca.crt" 2>/dev/null
}

# make_front_proxy_ca: the CA of the aggregation layer's front proxy (kubeadm's front-proxy-ca).
# Extension API servers (the External metrics adapter) believe the user named in a request's
# X-Remote-User header only from a client certificate of this CA: a CA of its own, so that no
# other certificate the cluster CA signs can claim to be the front proxy.
make_front_proxy_ca() {
  local p=$CLUSTER_PKI
  [[ -f $p/front-proxy-ca.key && -f $p/front-proxy-ca.crt ]] && return 0
  openssl genrsa -out "$p/front-proxy-ca.key" 2048 2>/dev/null
  chmod 600 "$p/front-proxy-ca.key"
  openssl req -x509 -new -key "$p/front-proxy-ca.key" -subj "/CN=sandbox-executor-local-front-proxy-ca" -days "$CERT_DAYS" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$p/front-proxy-ca.crt" 2>/dev/null
}

# make_cert NAME CN ORG SANS USAGE(server|client) [CA]: signed by CA (default: the cluster CA,
# "ca"), skipped if present.
make_cert() {
  local name=$1 cn=$2 org=$3 sans=$4 usage=$5 ca=${6:-ca} p=$CLUSTER_PKI
  [[ -f $p/$name.crt && -f $p/$name.key ]] && return 0
  ((${#cn} <= 64)) || die "certificate CN longer than 64 characters: $cn"
  local subj="/CN=$cn" ext
  [[ -n $org ]] && subj="/O=$org/CN=$cn"
  ext=$(mktemp)
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$([[ $usage == server ]] && echo serverAuth || echo clientAuth)"
    [[ -n $sans ]] && echo "subjectAltName=$sans"
  } >"$ext"
  openssl genrsa -out "$p/$name.key" 2048 2>/dev/null
  openssl req -new -key "$p/$name.key" -subj "$subj" 2>/dev/null |
    openssl x509 -req -CA "$p/$ca.crt" -CAkey "$p/$ca.key" -CAcreateserial -days "$CERT_DAYS" \
      -extfile "$ext" -out "$p/$name.crt" 2>/dev/null
  rm -f "$ext"
}

# kubeconfig_with FILE USER_NAME USER_YAML [NAMESPACE]: a one-context kubeconfig for our apiserver.
kubeconfig_with() {
  local file=$1 user=$2 user_yaml=$3 ns=${4:+, namespace: $4}
  install -m 600 /dev/null "$file.tmp"
  cat >"$file.tmp" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: sandbox-executor-local
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $(b64 "$CLUSTER_PKI/ca.crt")
users:
- name: $user
  user:
$user_yaml
contexts:
- name: $user@sandbox-executor-local
  context: {cluster: sandbox-executor-local, user: $user$ns}
current-context: $user@sandbox-executor-local
YAML
  mv -f "$file.tmp" "$file"
}

# cert_kubeconfig NAME CERT: $CLUSTER_KUBECONFIGS/NAME.kubeconfig authenticating with CERT.
cert_kubeconfig() {
  kubeconfig_with "$CLUSTER_KUBECONFIGS/$1.kubeconfig" "$1" \
    "    client-certificate-data: $(b64 "$CLUSTER_PKI/$2.crt")
    client-key-data: $(b64 "$CLUSTER_PKI/$2.key")"
}

pki() {
  ensure_dirs
  local identity="$NODE_NAME $NODE_IP $SERVICE_CIDR"
  if ! stamp_matches "$CLUSTER_PKI/identity" "$identity"; then
    # Node name/IP are in the certificates: start over (keeps nothing but the directory).
    find "$CLUSTER_PKI" -mindepth 1 -delete
    stamp_write "$CLUSTER_PKI/identity" "$identity"
  fi
  make_ca
  make_agent_ca
  # The first address of the service CIDR is the `kubernetes` Service's ClusterIP.
  local svc_ip
  svc_ip=$(echo "${SERVICE_CIDR%/*}" | awk -F. '{print $1"."$2"."$3"."$4+1}')
  make_cert apiserver kube-apiserver "" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:$svc_ip" server
  make_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" client
  make_cert admin cluster-admin system:masters "" client
  make_cert controller-manager system:kube-controller-manager "" "" client
  make_cert scheduler system:kube-scheduler "" "" client
  make_cert kubelet-client "system:node:$NODE_NAME" system:nodes "" client
  make_cert kubelet-server "$NODE_NAME" "" "DNS:$NODE_NAME,DNS:localhost,IP:$NODE_IP,IP:127.0.0.1" server
  make_cert kube-proxy system:kube-proxy "" "" client
  # The aggregation layer: kube-apiserver presents this to extension API servers when it
  # proxies a request to them (start.sh: --proxy-client-cert-file). Also made on a cluster whose
  # other certificates predate it.
  make_front_proxy_ca
  make_cert front-proxy-client front-proxy-client "" "" client front-proxy-ca
  if [[ ! -f $CLUSTER_PKI/sa.key ]]; then
    openssl genrsa -out "$CLUSTER_PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$CLUSTER_PKI/sa.key" -pubout -out "$CLUSTER_PKI/sa.pub" 2>/dev/null
  fi
  chmod 600 "$CLUSTER_PKI"/*.key
  cert_kubeconfig admin admin
  cert_kubeconfig controller-manager controller-manager
  cert_kubeconfig scheduler scheduler
  cert_kubeconfig kubelet kubelet-client
  cert_kubeconfig kube-proxy kube-proxy
  log "PKI in $CLUSTER_PKI, kubeconfigs in $CLUSTER_KUBECONFIGS"
}

executor_kubeconfig() {
  local token
  token=$(kubectl_admin -n "$EXECUTOR_NAMESPACE" create token "$EXECUTOR_SERVICEACCOUNT" \
    --duration="$EXECUTOR_TOKEN_DURATION") || die "cannot create a token for $EXECUTOR_NAMESPACE/$EXECUTOR_SERVICEACCOUNT"
  # The context carries the namespace, so the executor's clients need no --namespace.
  kubeconfig_with "$EXECUTOR_KUBECONFIG" "$EXECUTOR_SERVICEACCOUNT" "    token: $token" "$EXECUTOR_NAMESPACE"
  log "wrote $EXECUTOR_KUBECONFIG (ServiceAccount $EXECUTOR_NAMESPACE/$EXECUTOR_SERVICEACCOUNT, token valid $EXECUTOR_TOKEN_DURATION)"
}

main() {
  case ${1:-} in
    pki) pki ;;
    executor-kubeconfig) executor_kubeconfig ;;
    *) die "usage: certs.sh pki|executor-kubeconfig" ;;
  esac
}

run_main "$@"
