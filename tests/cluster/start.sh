#!/usr/bin/env bash
# start.sh: start and stop the node's daemons, each tracked by a PID file in $CLUSTER_RUN.
#
#   start.sh start [etcd|apiserver|controller-manager|scheduler|containerd|kubelet|kube-proxy]...
#   start.sh stop  [same names]...        (no names: all, in reverse order)
#   start.sh kill  NAME...                 SIGKILL, as a crash would: open connections drop at once
#
# start waits until each daemon is really usable before the next one starts (containerd must
# log "successfully booted" before the kubelet connects, or the kubelet exits on "server is not
# initialized yet"). Stopping containerd also stops the pods' shims and gVisor sandboxes, which
# outlive containerd by design (see stop_pod_processes).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ALL_COMPONENTS=(etcd apiserver controller-manager scheduler containerd kubelet kube-proxy)
TASK_STATE=$CLUSTER_DIR/containerd/state/io.containerd.runtime.v2.task

# daemon NAME of each component (PID file and log name)
daemon_name() {
  case $1 in
    etcd | containerd | kubelet | kube-proxy) echo "$1" ;;
    *) echo "kube-$1" ;;
  esac
}

curl_ok() { http_get "$@" >/dev/null; }

start_etcd() {
  mkdir -p "$CLUSTER_DIR/etcd"
  chmod 700 "$CLUSTER_DIR/etcd"
  start_daemon etcd "$CLUSTER_BIN/etcd" --name sandbox-executor --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls "$ETCD_CLIENT_URL" --advertise-client-urls "$ETCD_CLIENT_URL" \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster sandbox-executor=http://127.0.0.1:2380 --listen-metrics-urls "$ETCD_METRICS_URL" \
    --quota-backend-bytes 2147483648 --snapshot-count 10000 --log-level warn
  wait_until "etcd healthy" 60 curl_ok "$ETCD_METRICS_URL/health"
}

# An apiserver started by an earlier start.sh, before the aggregation layer's flags, would be
# left running by start_daemon: restart it once so that a cluster-up gives every cluster them.
restart_apiserver_without_aggregation() {
  local pid
  pid=$(daemon_pid kube-apiserver) || return 0
  tr '\0' '\n' <"/proc/$pid/cmdline" | grep -q '^--proxy-client-cert-file=' && return 0
  log "kube-apiserver (pid $pid) runs without the aggregation layer's flags: restarting it"
  stop_component apiserver
}

start_apiserver() {
  local p=$CLUSTER_PKI
  restart_apiserver_without_aggregation
  # Webhooks (agent-sandbox's CRD conversion) are called at their Service's ClusterIP, routed
  # by kube-proxy's OUTPUT rules on this node, as on any cluster; so are the extension API
  # servers of the aggregation layer (an APIService's Service: no --enable-aggregator-routing).
  # The requestheader/proxy-client flags are that layer: the apiserver proxies such requests
  # with the front proxy's client certificate and the caller's identity in X-Remote-* headers.
  start_daemon kube-apiserver "$CLUSTER_BIN/kube-apiserver" --etcd-servers="$ETCD_CLIENT_URL" \
    --bind-address="$NODE_IP" --advertise-address="$NODE_IP" --secure-port="$APISERVER_PORT" \
    --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$p/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --requestheader-client-ca-file="$p/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$p/front-proxy-client.crt" --proxy-client-key-file="$p/front-proxy-client.key" \
    --profiling=false --v=1
  wait_until "kube-apiserver ready" 180 curl_ok --cacert "$p/ca.crt" "$APISERVER_URL/readyz"
}

start_controller_manager() {
  local k=$CLUSTER_KUBECONFIGS/controller-manager.kubeconfig p=$CLUSTER_PKI
  start_daemon kube-controller-manager "$CLUSTER_BIN/kube-controller-manager" --kubeconfig="$k" \
    --authentication-kubeconfig="$k" --authorization-kubeconfig="$k" --bind-address=127.0.0.1 \
    --leader-elect=false --use-service-account-credentials=true \
    --cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" --root-ca-file="$p/ca.crt" \
    --service-account-private-key-file="$p/sa.key" --service-cluster-ip-range="$SERVICE_CIDR" \
    --allocate-node-cidrs=false --profiling=false --v=1
  wait_until "kube-controller-manager healthy" 60 curl_ok -k https://127.0.0.1:10257/healthz
}

start_scheduler() {
  local k=$CLUSTER_KUBECONFIGS/scheduler.kubeconfig
  start_daemon kube-scheduler "$CLUSTER_BIN/kube-scheduler" --kubeconfig="$k" \
    --authentication-kubeconfig="$k" --authorization-kubeconfig="$k" --bind-address=127.0.0.1 \
    --leader-elect=false --profiling=false --v=1
  wait_until "kube-scheduler healthy" 60 curl_ok -k https://127.0.0.1:10259/healthz
}

start_containerd() {
  mkdir -p "$CLUSTER_DIR/containerd"
  start_daemon containerd "$CLUSTER_BIN/containerd" --config "$CLUSTER_ETC/containerd.toml"
  # The gRPC socket answers before the CRI plugin has recovered its state.
  wait_until "containerd booted" 60 grep -q "successfully booted" "$CLUSTER_LOG/containerd.log"
}

node_ready() {
  kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True
}

start_kubelet() {
  mkdir -p "$CLUSTER_DIR/kubelet" "$CLUSTER_LOG/pods"
  start_daemon kubelet "$CLUSTER_BIN/kubelet" --config="$CLUSTER_ETC/kubelet.yaml" \
    --kubeconfig="$CLUSTER_KUBECONFIGS/kubelet.kubeconfig" --root-dir="$CLUSTER_DIR/kubelet" \
    --cert-dir="$CLUSTER_DIR/kubelet/pki" --node-ip="$NODE_IP" --hostname-override="$NODE_NAME" --v=1
  # After a restart the node can still show the old Ready condition: trust the kubelet's own
  # health endpoint first (exec would otherwise get "connection refused" on :10250).
  wait_until "kubelet healthy" 120 curl_ok "$KUBELET_HEALTHZ_URL"
  wait_until "node $NODE_NAME Ready" 180 node_ready
}

# kube-proxy, a host daemon like the kubelet, routes the service CIDR with iptables rules; it is
# ready once it has written them (healthz answers 200 only after its first sync).
start_kube_proxy() {
  start_daemon kube-proxy "$CLUSTER_BIN/kube-proxy" --config="$CLUSTER_ETC/kube-proxy.yaml" --v=1
  wait_until "kube-proxy synced" 60 curl_ok "http://$KUBE_PROXY_HEALTHZ_ADDR/healthz"
  wait_until "kubernetes Service routed" 30 service_routed default/kubernetes:https
}

# service_routed NAMESPACE/NAME:PORT: kube-proxy has a rule for that Service port's ClusterIP.
service_routed() { iptables -t nat -S KUBE-SERVICES | grep -qF "\"$1 cluster IP\""; }

# --- stopping -------------------------------------------------------------------------------

# our_pod_binary EXE: our own gVisor or containerd shim binary (possibly "(deleted)" if rebuilt).
our_pod_binary() {
  case $1 in
    "$CLUSTER_BIN"/runsc* | "$CLUSTER_BIN"/containerd-shim-*) return 0 ;;
    *) return 1 ;;
  esac
}

# owned_pod_process PID: true if PID runs our shim/runsc or lives in a kubelet pod cgroup, so a
# stale PID file whose number was reused by an unrelated process is never acted upon.
owned_pod_process() {
  local exe
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  our_pod_binary "$exe" && return 0
  grep -q ':/kubepods' "/proc/$1/cgroup" 2>/dev/null
}

# Pod processes (containerd shims, gVisor sandboxes and gofers, runc containers) outlive
# containerd on purpose. Stop them: first through containerd while it still runs, then by the
# PID files containerd left in its task state, then anything still running one of our binaries.
stop_pod_processes() {
  local id ids=() f pid left
  if daemon_running containerd; then
    mapfile -t ids < <(ctr_k8s tasks ls -q 2>/dev/null || true)
    for id in "${ids[@]}"; do ctr_k8s tasks kill --all --signal SIGKILL "$id" >/dev/null 2>&1 || true; done
    for id in "${ids[@]}"; do ctr_k8s tasks delete --force "$id" >/dev/null 2>&1 || true; done
    ((${#ids[@]} == 0)) || log "stopped ${#ids[@]} pod task(s) through containerd"
  fi
  stop_daemon containerd 30
  for f in "$TASK_STATE"/*/*/shim.pid "$TASK_STATE"/*/*/init.pid; do
    [[ -f $f ]] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    [[ -n $pid ]] && owned_pod_process "$pid" && kill -KILL "$pid" 2>/dev/null && log "killed orphan pid $pid (${f#"$TASK_STATE"/})"
  done
  # gVisor gofers and sandboxes that no PID file names: they run our runsc binary.
  for left in /proc/[0-9]*; do
    pid=${left#/proc/}
    left=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
    if our_pod_binary "$left"; then
      kill -KILL "$pid" 2>/dev/null && log "killed leftover $left (pid $pid)"
    fi
  done
  return 0
}

# Shims bind /run/containerd/s/<sha256(containerd address/namespace/id)>; the gVisor shim does
# not remove its socket when it exits, so they pile up (one per container ever run). Remove the
# socket files that no process has bound any more (/proc/net/unix lists the bound ones).
prune_dead_shim_sockets() {
  local s bound n=0
  bound=$(awk 'NR > 1 && $8 ~ "^/run/containerd/s/" {print $8}' /proc/net/unix | sort -u)
  for s in /run/containerd/s/*; do
    [[ -S $s ]] || continue
    grep -qxF "$s" <<<"$bound" && continue
    rm -f "$s" && n=$((n + 1))
  done
  ((n == 0)) || log "removed $n dead shim socket(s) from /run/containerd/s"
}

# Unmount everything mounted below $CLUSTER_DIR (container rootfs overlays, sandbox shm,
# kubelet volumes), deepest first.
unmount_state() {
  local m n=0
  while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || warn "cannot unmount $m"
    n=$((n + 1))
  done < <(awk -v d="$CLUSTER_DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  ((n == 0)) || log "unmounted $n mount(s) under $CLUSTER_DIR"
}

stop_component() {
  case $1 in
    kubelet) stop_daemon kubelet 20 ;;
    kube-proxy) stop_daemon kube-proxy 10 ;;
    containerd) stop_pod_processes && unmount_state && prune_dead_shim_sockets ;;
    # The apiserver's graceful shutdown waits up to a minute for connected clients (watches of
    # the agent-sandbox controller, of other engineers' tools) to go away; it keeps no state of
    # its own, so it gets 5 s.
    apiserver) stop_daemon kube-apiserver 5 ;;
    etcd | controller-manager | scheduler) stop_daemon "$(daemon_name "$1")" 20 ;;
    *) die "unknown component: $1" ;;
  esac
}

main() {
  local verb=${1:-} c
  shift || true
  ensure_dirs
  case $verb in
    start)
      (($#)) || set -- "${ALL_COMPONENTS[@]}"
      for c in "$@"; do
        case $c in
          etcd | apiserver | controller-manager | scheduler | containerd | kubelet | kube-proxy) "start_${c//-/_}" ;;
          *) die "unknown component: $c" ;;
        esac
      done
      ;;
    stop)
      if (($# == 0)); then
        for ((c = ${#ALL_COMPONENTS[@]} - 1; c >= 0; c--)); do stop_component "${ALL_COMPONENTS[c]}"; done
      else
        for c in "$@"; do stop_component "$c"; done
      fi
      ;;
    kill)
      (($# > 0)) || die "usage: start.sh kill component..."
      for c in "$@"; do kill_daemon "$(daemon_name "$c")"; done
      ;;
    *) die "usage: start.sh start|stop|kill [component...]" ;;
  esac
}

run_main "$@"
