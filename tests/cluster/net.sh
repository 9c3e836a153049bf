#!/usr/bin/env bash
# net.sh: the node's network plumbing (idempotent).
#
#   net.sh up     node bridge with the node IP, service CIDR route, iptables guard chains
#   net.sh down   remove all of it (down.sh --wipe)
#
# - The node IP ($NODE_IP) sits on $NODE_BRIDGE, a bridge with no ports: this kernel has no
#   `dummy` netdev, and the node IP must not be loopback (the agent-sandbox webhook endpoint
#   and the kubelet's address both use it). It never leaves the machine.
# - Pods get $POD_CIDR on $POD_BRIDGE (created by the CNI bridge plugin, removed here on down)
#   with a default route to $POD_GATEWAY; the node forwards nothing but pod<->pod traffic
#   ($POD_FORWARD_CHAIN), so pods cannot reach any real network. Another script may open a
#   destination by inserting `-d CIDR -j RETURN` at the top of that chain.
# - Services: kube-proxy (iptables mode) DNATs ClusterIPs to endpoints. The service CIDR is routed
#   to $NODE_BRIDGE (no ports; in a table of its own), so the node's own connections (the apiserver calling a webhook
#   Service) get a route and a source address before kube-proxy's OUTPUT rules rewrite them, and a
#   ClusterIP that no rule rewrites leads nowhere.
# - Pods talk to the node only in reply to connections the node opened (kubelet probes, exec
#   streams run node -> pod), and to the API server only through the kubernetes Service (the
#   conntrack entry remembers the ClusterIP it was DNATed from; in-cluster controllers, CoreDNS and
#   runners need it; NetworkPolicy still decides which pods may); $NODE_INPUT_CHAIN drops anything
#   else from the pod CIDR. Open a node port for pods with
#   `iptables -I SBX-INPUT 1 -s $POD_CIDR -p tcp --dport PORT -j RETURN`.
# - The pod network is IPv4-only, but every veth still gets an IPv6 link-local address, and
#   NetworkPolicy (kube-router) and the chains above are IPv4 only: without $POD_V6_CHAIN a job
#   reached other job pods and the node's [::] listeners over fe80:: addresses. It drops all IPv6
#   that enters from or leaves through $POD_BRIDGE.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Policy routing for the service CIDR (node_bridge_up).
SERVICE_ROUTE_TABLE=7796
SERVICE_ROUTE_PRIORITY=7796

# ensure_jump TABLE_CHAIN TARGET: a single jump from a built-in chain into ours, at the top.
ensure_jump() {
  iptables -C "$1" -j "$2" 2>/dev/null || iptables -I "$1" 1 -j "$2"
}

# ensure_chain CHAIN: create it if missing. Never flushed here: networkpolicy.sh inserts its
# own RETURN rules at the top of $POD_FORWARD_CHAIN and they must survive a second up.sh.
ensure_chain() {
  iptables -N "$1" 2>/dev/null || true
}

# ensure_rule CHAIN RULE...: append RULE unless the chain already has it.
ensure_rule() {
  local chain=$1
  shift
  iptables -C "$chain" "$@" 2>/dev/null || iptables -A "$chain" "$@"
}

# ensure_rule_first CHAIN RULE...: insert RULE at the top unless the chain already has it.
ensure_rule_first() {
  local chain=$1
  shift
  iptables -C "$chain" "$@" 2>/dev/null || iptables -I "$chain" 1 "$@"
}

node_bridge_up() {
  ip link show "$NODE_BRIDGE" >/dev/null 2>&1 || ip link add "$NODE_BRIDGE" type bridge
  ip addr replace "$NODE_IP/32" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  # The service CIDR has a routing table of its own, looked up before main: an older net.sh
  # (shared machine) that routes it unreachable in main cannot take it away.
  ip route replace "$SERVICE_CIDR" dev "$NODE_BRIDGE" src "$NODE_IP" table "$SERVICE_ROUTE_TABLE"
  ip rule show priority "$SERVICE_ROUTE_PRIORITY" | grep -q "to $SERVICE_CIDR lookup $SERVICE_ROUTE_TABLE" ||
    ip rule add priority "$SERVICE_ROUTE_PRIORITY" to "$SERVICE_CIDR" lookup "$SERVICE_ROUTE_TABLE"
  ip route del unreachable "$SERVICE_CIDR" 2>/dev/null || true
}

guard_chains_up() {
  ensure_chain "$POD_FORWARD_CHAIN"
  ensure_rule "$POD_FORWARD_CHAIN" -s "$POD_CIDR" -d "$POD_CIDR" -j RETURN
  ensure_rule "$POD_FORWARD_CHAIN" -s "$POD_CIDR" -m comment --comment "sandbox-executor: pods reach no real network" -j DROP
  ensure_rule "$POD_FORWARD_CHAIN" -d "$POD_CIDR" -m comment --comment "sandbox-executor: nothing routed into pods" -j DROP
  ensure_jump FORWARD "$POD_FORWARD_CHAIN"

  ensure_chain "$NODE_INPUT_CHAIN"
  ensure_rule "$NODE_INPUT_CHAIN" -s "$POD_CIDR" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
  # At the top: on a chain from before it must still come ahead of the DROP.
  ensure_rule_first "$NODE_INPUT_CHAIN" -s "$POD_CIDR" -d "$NODE_IP" -p tcp --dport "$APISERVER_PORT" \
    -m conntrack --ctstate DNAT --ctorigdst "$KUBERNETES_SERVICE_IP" --ctorigdstport 443 \
    -m comment --comment "sandbox-executor: pods reach the API server through the kubernetes Service only" -j RETURN
  ensure_rule "$NODE_INPUT_CHAIN" -s "$POD_CIDR" -m comment --comment "sandbox-executor: pods open no connection to the node" -j DROP
  drop_legacy_webhook_rules
  ensure_jump INPUT "$NODE_INPUT_CHAIN"
}

# The agent-sandbox controller once ran on the node with its webhook on :9443 of every address;
# it runs in a pod now. Remove the rules that guarded that port on a cluster from before.
drop_legacy_webhook_rules() {
  iptables -D "$NODE_INPUT_CHAIN" -p tcp --dport 9443 -i lo -j RETURN 2>/dev/null || true
  iptables -D "$NODE_INPUT_CHAIN" -p tcp --dport 9443 -m comment --comment "sandbox-executor: webhook is node-local" -j DROP 2>/dev/null || true
}

guard_v6_up() {
  ip6tables -N "$POD_V6_CHAIN" 2>/dev/null || true
  local dir
  for dir in -i -o; do
    ip6tables -C "$POD_V6_CHAIN" "$dir" "$POD_BRIDGE" -j DROP 2>/dev/null ||
      ip6tables -A "$POD_V6_CHAIN" "$dir" "$POD_BRIDGE" -m comment --comment "sandbox-executor: no IPv6 on the pod network" -j DROP
  done
  local builtin
  for builtin in INPUT FORWARD; do
    ip6tables -C "$builtin" -j "$POD_V6_CHAIN" 2>/dev/null || ip6tables -I "$builtin" 1 -j "$POD_V6_CHAIN"
  done
}

# remove_chain BUILTIN CHAIN [iptables|ip6tables]
remove_chain() {
  local ipt=${3:-iptables}
  while $ipt -D "$1" -j "$2" 2>/dev/null; do :; done
  $ipt -F "$2" 2>/dev/null || true
  $ipt -X "$2" 2>/dev/null || true
}

net_up() {
  node_bridge_up
  guard_chains_up
  guard_v6_up
  log "node IP $NODE_IP on $NODE_BRIDGE; pods $POD_CIDR via $POD_BRIDGE; services $SERVICE_CIDR (kube-proxy)"
}

net_down() {
  remove_chain FORWARD "$POD_FORWARD_CHAIN"
  remove_chain INPUT "$NODE_INPUT_CHAIN"
  local builtin
  for builtin in INPUT FORWARD; do remove_chain "$builtin" "$POD_V6_CHAIN" ip6tables; done
  while ip rule del priority "$SERVICE_ROUTE_PRIORITY" 2>/dev/null; do :; done
  ip route flush table "$SERVICE_ROUTE_TABLE" 2>/dev/null || true
  ip route del unreachable "$SERVICE_CIDR" 2>/dev/null || true
  local br
  for br in "$POD_BRIDGE" "$NODE_BRIDGE"; do
    if ip link del "$br" 2>/dev/null; then log "removed bridge $br"; fi
  done
}

main() {
  case ${1:-} in
    up) net_up ;;
    down) net_down ;;
    *) die "usage: net.sh up|down" ;;
  esac
}

run_main "$@"
