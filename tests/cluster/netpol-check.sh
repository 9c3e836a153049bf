#!/usr/bin/env bash
# Prove that the local cluster ENFORCES NetworkPolicy, with gVisor pods.
#
# Usage: tests/cluster/netpol-check.sh [--enforcement]
#        (needs the cluster up; runs networkpolicy.sh up itself)
#
# --enforcement proves only that enforcement is on, for the suites' checks before their first test
# and after a test broke and restored a component (tests/harness/clusterjobs/whole.go): pod a
# alone, its gVisor kernel, ci image and cluster DNS, its positive controls, the node's forward guard,
# and a deny-all egress policy taking effect on it. About a third of the full run's time; the full
# semantics are `make netpol`'s, once per `make check`.
#
# In a scratch namespace: pod A (client) and pod B (HTTP server on :8080), both runtimeClassName
# gvisor. Positive controls first (A reaches the outside world, "the GitLab instance" and B), then
# egress deny-all on A, then deny-all + allow 10.99.1.0/24 TCP 80 ("GitLab" only), then policies
# removed (reachability restored), then ingress deny-all on B and an ingress allow from A.
# Also, with no policy at all: A cannot reach 10.100.0.2 (routed, but not opened in net.sh's
# SBX-FORWARD) nor open a connection to the node (SBX-INPUT), i.e. kube-router does not weaken the
# node's own guard chains (see the kube-router patch in networkpolicy.sh).
# One line per check (PASS/FAIL), exit 1 on any failure. The namespace is deleted at the end
# (NETPOL_CHECK_KEEP=1 keeps it).
#
# "blocked" means: the request fails twice in a row after the policy change; "reachable" means the
# expected body came back. Both are polled for up to $NETPOL_CHECK_WAIT seconds, so the time to
# enforce a policy change is part of each line.
set -uo pipefail

SCOPE=full
case ${1:-} in
  "") ;;
  --enforcement) SCOPE=enforcement ;;
  *) echo "usage: $0 [--enforcement]" >&2; exit 2 ;;
esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -f "$HERE/lib.sh" ]; then
  # shellcheck source=/dev/null
  . "$HERE/lib.sh"
  set -uo pipefail
  set +e
fi
CACHE_ROOT=${SANDBOX_EXECUTOR_CACHE:-$HOME/.cache/sandbox-executor}
CLUSTER_DIR=${CLUSTER_DIR:-$CACHE_ROOT/cluster}
KUBECTL=${KUBECTL:-$CLUSTER_DIR/bin/kubectl}
KUBECONFIG_FILE=${ADMIN_KUBECONFIG:-$CLUSTER_DIR/kubeconfig/admin.kubeconfig}
IMAGE=${NETPOL_CHECK_IMAGE:-sandbox-executor.local/ci:bookworm}
RUNTIME_CLASS=${NETPOL_CHECK_RUNTIME_CLASS:-gvisor}
WAIT=${NETPOL_CHECK_WAIT:-30}
NS=netpol-check-$(date +%s)
OUT=10.99.0.2; GL=10.99.1.2; PORT=80; GL_ALT=9090   # servers of networkpolicy.sh (netns sbx-outside, sbx-gitlab)
B_PORT=8080                                          # pod b's HTTP server
UNOPENED=10.100.0.2                 # same server as $OUT, but net.sh's guard does not open it
NODE_IP=${NODE_IP:-10.77.0.1}

k() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
now_ms() { date +%s%3N; }
T0=$(now_ms)
PASSES=0; FAILS=0
pass() { PASSES=$((PASSES + 1)); printf 'PASS  %s\n' "$*"; }
fail() { FAILS=$((FAILS + 1)); printf 'FAIL  %s\n' "$*"; }
secs() { local ms=$(( $(now_ms) - $1 )); printf '%d.%01ds' $((ms / 1000)) $(((ms % 1000) / 100)); }

cleanup() {
  local rc=$?
  if [ "${NETPOL_CHECK_KEEP:-0}" = 1 ]; then
    echo "keeping namespace $NS"
  elif [ "${NS_CREATED:-0}" = 1 ]; then
    # retry: the API server may be restarting (the next run also removes leftovers by label)
    local t i out; t=$(now_ms)
    for i in 1 2 3 4 5 6; do
      # --enforcement does not wait for the namespace to go: the suite goes on meanwhile.
      if out=$(k delete ns "$NS" --ignore-not-found --wait="$([ "$SCOPE" = full ] && echo true || echo false)" --timeout=120s 2>&1); then
        echo "cleanup: namespace $NS deleted in $(secs "$t")"; break
      fi
      [ $i = 6 ] && echo "warning: could not delete namespace $NS ($out)"
      sleep 5
    done
  fi
  echo "total: $(secs "$T0"), $PASSES passed, $FAILS failed"
  [ "$FAILS" = 0 ] && [ "$rc" = 0 ] || exit 1
}
trap cleanup EXIT

die_fail() { fail "$*"; exit 1; }

# --- preflight ---------------------------------------------------------------------------------
[ -x "$KUBECTL" ] || die_fail "preflight: $KUBECTL missing (is the cluster built?)"
k get --raw /readyz >/dev/null 2>&1 || die_fail "preflight: API server not answering with $KUBECONFIG_FILE"
t=$(now_ms)
uplog=$(mktemp)
# idempotent: quick when kube-router and the outside world already run; re-opens the outside
# world in net.sh's guard chain in case net.sh flushed it since
if "$HERE/networkpolicy.sh" up >"$uplog" 2>&1 && "$HERE/networkpolicy.sh" ensure-net >>"$uplog" 2>&1; then
  pass "preflight: networkpolicy.sh up (kube-router + outside world) ($(secs "$t"))"
  rm -f "$uplog"
else
  cat "$uplog"; rm -f "$uplog"
  die_fail "preflight: tests/cluster/networkpolicy.sh up failed"
fi
echo "enforcement: $("$CLUSTER_DIR/bin/kube-router" --version 2>&1 | head -1 | sed 's/^Running //'); cluster: $(k version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])' 2>/dev/null)"
k get runtimeclass "$RUNTIME_CLASS" >/dev/null 2>&1 || die_fail "preflight: RuntimeClass $RUNTIME_CLASS missing"

# --- pods ----------------------------------------------------------------------------------------
t=$(now_ms)
# leftovers of runs that could not clean up (API server gone at the time): only those whose
# netpol-check.sh has exited (or, unlabelled by an older version, are over 10 minutes old); a
# run going on at the same time (a shared machine) keeps its namespace.
k get ns -l app.kubernetes.io/managed-by=netpol-check \
  -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.creationTimestamp} {.metadata.labels.netpol-check/pid}{"\n"}{end}' 2>/dev/null |
  while read -r old created pid; do
    if [ -n "$pid" ]; then
      kill -0 "$pid" 2>/dev/null && continue
    elif [ $(($(date +%s) - $(date -d "$created" +%s))) -lt 600 ]; then
      continue
    fi
    k delete ns "$old" --wait=false >/dev/null 2>&1 || true
  done
k create ns "$NS" >/dev/null || die_fail "create namespace $NS"
NS_CREATED=1
k label ns "$NS" app.kubernetes.io/managed-by=netpol-check "netpol-check/pid=$$" >/dev/null || die_fail "label namespace $NS"
for _ in $(seq 1 30); do k -n "$NS" get sa default >/dev/null 2>&1 && break; sleep 1; done
pod() { # name label command...
  local name=$1 app=$2; shift 2
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: $NS, labels: {app: $app}}
spec:
  runtimeClassName: $RUNTIME_CLASS
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
  - name: main
    image: $IMAGE
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", $(printf '%s' "$*" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')]
    resources: {requests: {cpu: 10m, memory: 32Mi}}
---
EOF
}
PODS=(a b)
[ "$SCOPE" = full ] || PODS=(a)
{
  pod a netpol-a 'exec sleep infinity'
  if [ "$SCOPE" = full ]; then pod b netpol-b "exec node -e 'require(\"http\").createServer((q,s)=>s.end(\"pod-b\\n\")).listen($B_PORT)'"; fi
} | k apply -f - >/dev/null || die_fail "create pods"
if k -n "$NS" wait --for=condition=Ready "${PODS[@]/#/pod/}" --timeout=180s >/dev/null; then
  pass "pods ${PODS[*]} Ready (runtimeClassName $RUNTIME_CLASS, $IMAGE) ($(secs "$t"))"
else
  k -n "$NS" get pods -o wide; k -n "$NS" describe pods | tail -40
  die_fail "pods ${PODS[*]} not Ready within 180s"
fi
A_IP=$(k -n "$NS" get pod a -o jsonpath='{.status.podIP}')
B_IP=
[ "$SCOPE" = full ] && B_IP=$(k -n "$NS" get pod b -o jsonpath='{.status.podIP}')
echo "pod a $A_IP${B_IP:+, pod b $B_IP}"

# gVisor copies the pod's routes at sandbox start: without a route to 10.99.0.0/16 nothing below
# can work, and the reason would be the CNI config, not NetworkPolicy.
if routes=$(k -n "$NS" exec a -- cat /proc/net/route 2>&1); then
  if echo "$routes" | awk 'NR>1 && ($2=="00000000" || $2=="0000630A") {f=1} END {exit !f}'; then
    pass "pod a has a route to 10.99.0.0/16"
  else
    fail "pod a has no route to 10.99.0.0/16 (CNI bridge ipam.routes needs 0.0.0.0/0 or 10.99.0.0/16): $(echo "$routes" | tr '\n' ' ')"
  fi
else
  echo "note: cannot read /proc/net/route in pod a ($routes); route check skipped"
fi

# The pod is a gVisor sandbox of the ci image, and resolves cluster names (before any policy: a
# deny-all egress stops DNS too). The suites' whole-cluster checks run check.sh --no-pods and
# leave these to this pod (tests/harness/clusterjobs/whole.go).
if out=$(pod_ci_image_report "$NS" a 2>&1); then
  pass "pod a runs under gVisor with the ci image's tools ($(printf '%s' "$out" | tr '\n' ' ' | cut -c1-90))"
else
  fail "pod a is not a gVisor sandbox of the ci image: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-200)"
fi
if out=$(pod_dns_report "$NS" a 2>&1); then
  pass "DNS from pod a: cluster names resolve, outside names do not"
else
  fail "DNS from pod a: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-200)"
fi

# --- probes ----------------------------------------------------------------------------------------
# fetch POD URL: curl inside the pod. Sets BODY (curl's output) and CURL_RC (curl's exit code, or
# "error" when kubectl exec itself failed: that is neither "reachable" nor "blocked").
fetch() {
  local out
  # shellcheck disable=SC2016  # $0/$? expand inside the pod's shell
  out=$(k -n "$NS" exec "$1" -- sh -c 'curl -ksS --connect-timeout 2 --max-time 4 "$0" 2>&1; printf "\n@@curl-exit=%s\n" "$?"' "$2" 2>&1)
  CURL_RC=$(printf '%s\n' "$out" | sed -n 's/^@@curl-exit=\([0-9]*\)$/\1/p' | tail -1)
  BODY=$(printf '%s\n' "$out" | grep -v '^@@curl-exit=' | sed '/^$/d')
  if [ -z "$CURL_RC" ]; then
    CURL_RC=error
    # the cluster or our pod went away (e.g. a concurrent down.sh): stop instead of failing every check
    k -n "$NS" get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null | grep -qx Running ||
      die_fail "pod $1 or the cluster is gone (kubectl exec: $(printf '%s' "$BODY" | tail -1))"
  fi
}
reach() { # desc pod url expected-body
  local desc=$1 p=$2 url=$3 want=$4 t; t=$(now_ms)
  while [ $(( $(now_ms) - t )) -lt $((WAIT * 1000)) ]; do
    fetch "$p" "$url"
    if [ "$CURL_RC" = 0 ] && [ "$(printf '%s\n' "$BODY" | head -1)" = "$want" ]; then
      pass "$desc: $p -> $url reachable ($(secs "$t"))"; return 0
    fi
    sleep 0.5
  done
  fail "$desc: $p -> $url NOT reachable after ${WAIT}s (curl exit $CURL_RC: $(printf '%s' "$BODY" | tail -1))"
}
blocked() { # desc pod url
  local desc=$1 p=$2 url=$3 t fails=0; t=$(now_ms)
  while [ $(( $(now_ms) - t )) -lt $((WAIT * 1000)) ]; do
    fetch "$p" "$url"
    case $CURL_RC in
      0) fails=0; sleep 0.5 ;;
      error) fails=0; sleep 1 ;;
      *) fails=$((fails + 1))
         if [ $fails -ge 2 ]; then
           pass "$desc: $p -> $url blocked ($(secs "$t"); curl exit $CURL_RC: $(printf '%s' "$BODY" | tail -1))"; return 0
         fi ;;
    esac
  done
  fail "$desc: $p -> $url NOT blocked after ${WAIT}s (curl exit $CURL_RC: $(printf '%s' "$BODY" | head -1))"
}
policy() { k -n "$NS" apply -f - >/dev/null || fail "apply policy"; }

# --- 1. positive controls --------------------------------------------------------------------------
reach "control" a "http://$OUT:$PORT/" outside
reach "control" a "http://$GL:$PORT/" gitlab
if [ "$SCOPE" = full ]; then
  reach "control" a "http://$GL:$GL_ALT/" gitlab-alt
  reach "control" a "http://$B_IP:$B_PORT/" pod-b
  reach "control" b "http://$OUT:$PORT/" outside
fi
if [ "$FAILS" != 0 ]; then
  die_fail "positive controls failed: the deny checks below would prove nothing, stopping"
fi
# kube-router must not weaken the node's own guard chains (net.sh): no policy selects these pods,
# kube-router allows the traffic, the node still drops it.
blocked "node guard, no policy" a "http://$UNOPENED:$PORT/"
[ "$SCOPE" = full ] && blocked "node guard, no policy" a "https://$NODE_IP:6443/healthz"

# --- 2. default-deny egress on A ---------------------------------------------------------------------
policy <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-deny-egress}
spec:
  podSelector: {matchLabels: {app: netpol-a}}
  policyTypes: [Egress]
EOF
blocked "deny-all egress" a "http://$OUT:$PORT/"
blocked "deny-all egress" a "http://$GL:$PORT/"
[ "$SCOPE" = full ] || exit 0 # the rest is NetworkPolicy's semantics, not whether it is enforced
blocked "deny-all egress" a "http://$B_IP:$B_PORT/"
reach "deny-all egress on a only" b "http://$OUT:$PORT/" outside

# --- 3. + allow egress to "GitLab" (10.99.1.0/24 TCP 80) only ----------------------------------------
policy <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-allow-gitlab}
spec:
  podSelector: {matchLabels: {app: netpol-a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.99.1.0/24}}]
    ports: [{protocol: TCP, port: $PORT}]
EOF
reach "allow gitlab:$PORT" a "http://$GL:$PORT/" gitlab
blocked "allow gitlab:$PORT" a "http://$GL:$GL_ALT/"
blocked "allow gitlab:$PORT" a "http://$OUT:$PORT/"
blocked "allow gitlab:$PORT" a "http://$B_IP:$B_PORT/"

# --- 4. policies removed: reachability restored ------------------------------------------------------
k -n "$NS" delete networkpolicy a-deny-egress a-allow-gitlab >/dev/null || fail "delete egress policies"
reach "egress policies removed" a "http://$OUT:$PORT/" outside
reach "egress policies removed" a "http://$B_IP:$B_PORT/" pod-b

# --- 5. ingress deny-all on B, then allow from A ---------------------------------------------------------
policy <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-deny-ingress}
spec:
  podSelector: {matchLabels: {app: netpol-b}}
  policyTypes: [Ingress]
EOF
blocked "deny-all ingress on b" a "http://$B_IP:$B_PORT/"
reach "deny-all ingress on b" a "http://$OUT:$PORT/" outside
reach "deny-all ingress on b (egress of b unaffected)" b "http://$OUT:$PORT/" outside
policy <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-allow-from-a}
spec:
  podSelector: {matchLabels: {app: netpol-b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: netpol-a}}}]
    ports: [{protocol: TCP, port: $B_PORT}]
EOF
reach "ingress allow from a" a "http://$B_IP:$B_PORT/" pod-b
