#!/usr/bin/env bash
# build.sh: build the cluster's binaries from the Go module proxy into $CLUSTER_BIN.
#
#   build.sh [all|k8s|etcd|containerd|gvisor|agent-sandbox|coredns]...
#
# Each component is built through a small wrapper module under $CLUSTER_BUILD/<name> that
# requires the pinned upstream module (their own go.mod files carry replace directives and
# cannot be `go install`ed directly). A component is skipped when $CLUSTER_BIN/.<name>.version
# holds the pinned version and all its binaries exist. Build output goes to
# $CLUSTER_LOG/build-<name>.log. The Go module and build caches are the user's usual ones.
#
# Why these and not Debian's: Debian's etcd 3.4 lacks RequestWatchProgress (CRD watches fail with
# "Too large resource version"), Debian's containerd 1.6 cannot parse the gVisor shim's start reply.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy)
ETCD_BINARIES=(etcd)
CONTAINERD_BINARIES=(containerd ctr containerd-shim-runc-v2)
GVISOR_BINARIES=(runsc containerd-shim-runsc-v1)
AGENT_SANDBOX_BINARIES=(agent-sandbox-controller)
COREDNS_BINARIES=(coredns)
# Bump when the local gVisor patch changes, so the stamp forces a rebuild.
GVISOR_PATCH_ID=oom-score-eacces-1

# up_to_date NAME STAMP_VALUE BINARIES...
up_to_date() {
  local name=$1 want=$2 b
  shift 2
  stamp_matches "$CLUSTER_BIN/.$name.version" "$want" || return 1
  for b in "$@"; do [[ -x $CLUSTER_BIN/$b ]] || return 1; done
}

# wrapper_module DIR MODULE_PATH GO_MOD_BODY IMPORTS...: write go.mod + a tools.go that
# blank-imports the commands, so `go mod tidy` resolves exactly what we build.
wrapper_module() {
  local dir=$1 mod=$2 body=$3 imp
  shift 3
  mkdir -p "$dir"
  printf 'module %s\n\ngo 1.26\n\n%s\n' "$mod" "$body" >"$dir/go.mod"
  {
    printf '//go:build tools\n\n// Package tools pins the commands this wrapper module builds.\npackage tools\n\nimport (\n'
    for imp in "$@"; do printf '\t_ "%s"\n' "$imp"; done
    printf ')\n'
  } >"$dir/tools.go"
  rm -f "$dir/go.sum"
}

# run_build NAME CMD...: run a build command in the background-friendly way: output to its log.
run_build() {
  local name=$1 logf=$CLUSTER_LOG/build-$1.log
  shift
  if ! with_progress "building $name" "$logf" "$@"; then
    tail -n 30 "$logf" >&2
    die "build of $name failed (log: $logf)"
  fi
}

build_k8s() {
  local v=$K8S_VERSION dir=$CLUSTER_BUILD/k8s
  up_to_date k8s "$v" "${K8S_BINARIES[@]}" && { log "k8s $v: up to date"; return 0; }
  : >"$CLUSTER_LOG/build-k8s.log"
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging;
  # a consumer must replace each with the matching published version (v1.36.3 -> v0.36.3).
  local upstream replaces
  upstream=$(module_dir "k8s.io/kubernetes@$v")
  replaces=$(sed -n '/^replace (/,/^)/p' "$upstream/go.mod" | awk -v sv="v0.${v#v1.}" '$3 ~ /^\.\/staging/ {print "\t" $1 " => " $1 " " sv}')
  [[ -n $replaces ]] || die "no staging replaces found in k8s.io/kubernetes@$v go.mod"
  wrapper_module "$dir" sandbox-executor.local/cluster-build/k8s \
    "require k8s.io/kubernetes $v

replace (
$replaces
)" k8s.io/kubernetes/cmd/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kubectl,kube-proxy}
  (cd "$dir" && run_build k8s go mod tidy)
  local minor=${v#v1.}
  minor=${minor%%.*}
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1
    -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean
    -X k8s.io/client-go/pkg/version.gitVersion=$v"
  (cd "$dir" && run_build k8s go build -trimpath -ldflags "$ldflags" -o "$CLUSTER_BIN/" \
    k8s.io/kubernetes/cmd/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kubectl,kube-proxy})
  stamp_write "$CLUSTER_BIN/.k8s.version" "$v"
}

build_etcd() {
  local v=$ETCD_VERSION dir=$CLUSTER_BUILD/etcd
  up_to_date etcd "$v" "${ETCD_BINARIES[@]}" && { log "etcd $v: up to date"; return 0; }
  : >"$CLUSTER_LOG/build-etcd.log"
  # The server module's main package is etcd itself; its sibling modules must be the same version.
  wrapper_module "$dir" sandbox-executor.local/cluster-build/etcd \
    "require go.etcd.io/etcd/server/v3 $v

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $v
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $v
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $v
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $v
)" go.etcd.io/etcd/server/v3
  (cd "$dir" && run_build etcd go mod tidy &&
    run_build etcd go build -trimpath -ldflags "-s -w" -o "$CLUSTER_BIN/etcd" go.etcd.io/etcd/server/v3)
  stamp_write "$CLUSTER_BIN/.etcd.version" "$v"
}

build_containerd() {
  local v=$CONTAINERD_VERSION dir=$CLUSTER_BUILD/containerd m=github.com/containerd/containerd/v2
  up_to_date containerd "$v" "${CONTAINERD_BINARIES[@]}" && { log "containerd $v: up to date"; return 0; }
  : >"$CLUSTER_LOG/build-containerd.log"
  wrapper_module "$dir" sandbox-executor.local/cluster-build/containerd "require $m $v" \
    "$m/cmd/containerd" "$m/cmd/ctr" "$m/cmd/containerd-shim-runc-v2"
  # No cgo: the btrfs/devmapper/zfs snapshotters need it and we only use overlayfs.
  (cd "$dir" && run_build containerd go mod tidy &&
    run_build containerd go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X $m/version.Version=$v -X $m/version.Revision=sandbox-executor" -o "$CLUSTER_BIN/" \
      "$m/cmd/containerd" "$m/cmd/ctr" "$m/cmd/containerd-shim-runc-v2")
  stamp_write "$CLUSTER_BIN/.containerd.version" "$v"
}

# The gVisor shim sets oom_score_adj=-999 on itself at start and treats EACCES as fatal; this VM
# has no CAP_SYS_RESOURCE. Make EACCES/EPERM non-fatal. The patch must not print anything:
# containerd parses the shim's combined start output as its bootstrap reply.
patch_gvisor_oom_score() {
  python3 - "$1/pkg/shim/v1/manager.go" <<'PY'
import sys
path = sys.argv[1]
src = open(path).read()
old = '\t\treturn shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)\n'
new = ('\t\t// sandbox-executor local patch: no CAP_SYS_RESOURCE in the VM, ignore EACCES/EPERM.\n'
       '\t\t// Nothing may be logged here: containerd parses the shim start output.\n'
       '\t\tif !os.IsPermission(err) {\n\t' + old + '\t\t}\n')
if src.count(old) != 1:
    sys.exit("gVisor OOM score patch: pattern not found in " + path)
open(path, 'w').write(src.replace(old, new))
PY
}

build_gvisor() {
  local v=$GVISOR_VERSION dir=$CLUSTER_BUILD/gvisor
  up_to_date gvisor "$v+$GVISOR_PATCH_ID" "${GVISOR_BINARIES[@]}" && { log "gvisor $v: up to date"; return 0; }
  : >"$CLUSTER_LOG/build-gvisor.log"
  local upstream
  upstream=$(module_dir "gvisor.dev/gvisor@$v")
  wrapper_module "$dir" sandbox-executor.local/cluster-build/gvisor \
    "require gvisor.dev/gvisor $v

replace gvisor.dev/gvisor => ./gvisor-src" gvisor.dev/gvisor/runsc gvisor.dev/gvisor/shim
  rm -rf "$dir/gvisor-src"
  cp -r "$upstream" "$dir/gvisor-src"
  chmod -R u+w "$dir/gvisor-src"
  patch_gvisor_oom_score "$dir/gvisor-src"
  (cd "$dir" && run_build gvisor go mod tidy &&
    run_build gvisor go build -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$v-sandbox-executor" \
      -o "$CLUSTER_BIN/runsc" gvisor.dev/gvisor/runsc &&
    run_build gvisor go build -trimpath -ldflags "-s -w" -o "$CLUSTER_BIN/containerd-shim-runsc-v1" gvisor.dev/gvisor/shim)
  stamp_write "$CLUSTER_BIN/.gvisor.version" "$v+$GVISOR_PATCH_ID"
}

build_agent_sandbox() {
  local v=$AGENT_SANDBOX_VERSION dir=$CLUSTER_BUILD/agent-sandbox m=sigs.k8s.io/agent-sandbox
  up_to_date agent-sandbox "$v" "${AGENT_SANDBOX_BINARIES[@]}" && { log "agent-sandbox $v: up to date"; return 0; }
  : >"$CLUSTER_LOG/build-agent-sandbox.log"
  wrapper_module "$dir" sandbox-executor.local/cluster-build/agent-sandbox "require $m $v" \
    "$m/cmd/agent-sandbox-controller"
  (cd "$dir" && run_build agent-sandbox go mod tidy &&
    run_build agent-sandbox go build -trimpath -ldflags "-s -w -X $m/internal/version.gitVersion=$v" \
      -o "$CLUSTER_BIN/agent-sandbox-controller" "$m/cmd/agent-sandbox-controller")
  stamp_write "$CLUSTER_BIN/.agent-sandbox.version" "$v"
}

# CoreDNS runs in-cluster (images.sh packs this static binary). Built, as CoreDNS documents for
# custom builds, from a main of our own with only the plugins manifests/coredns.yaml uses (in
# CoreDNS's own directive order): the full plugin set pulls in every cloud SDK and takes minutes.
COREDNS_PLUGINS=(reload ready health errors loadbalance cache kubernetes)

coredns_main() {
  local p
  printf '// Command coredns is CoreDNS with the plugins of tests/cluster/manifests/coredns.yaml only.\npackage main\n\nimport (\n'
  printf '\t"github.com/coredns/coredns/core/dnsserver"\n\t"github.com/coredns/coredns/coremain"\n\n'
  for p in "${COREDNS_PLUGINS[@]}"; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"; done
  printf ')\n\nfunc init() {\n\tdnsserver.Directives = []string{'
  for p in "${COREDNS_PLUGINS[@]}"; do printf '"%s", ' "$p"; done
  printf '}\n}\n\nfunc main() { coremain.Run() }\n'
}

build_coredns() {
  local v=$COREDNS_VERSION dir=$CLUSTER_BUILD/coredns m=github.com/coredns/coredns
  local stamp="$v+${COREDNS_PLUGINS[*]}"
  stamp=${stamp// /,}
  up_to_date coredns "$stamp" "${COREDNS_BINARIES[@]}" && { log "coredns $v: up to date"; return 0; }
  : >"$CLUSTER_LOG/build-coredns.log"
  wrapper_module "$dir" sandbox-executor.local/cluster-build/coredns "require $m $v" "$m/coremain"
  coredns_main >"$dir/main.go"
  (cd "$dir" && run_build coredns go mod tidy &&
    run_build coredns go build -trimpath -ldflags "-s -w -X $m/coremain.GitCommit=$v" -o "$CLUSTER_BIN/coredns" .)
  stamp_write "$CLUSTER_BIN/.coredns.version" "$stamp"
}

main() {
  ensure_dirs
  go_env
  local what=("$@") c
  ((${#what[@]})) || what=(all)
  [[ ${what[0]} == all ]] && what=(k8s etcd containerd gvisor agent-sandbox coredns)
  for c in "${what[@]}"; do
    case $c in
      k8s | etcd | containerd | gvisor | agent-sandbox | coredns) step "build $c" "build_${c//-/_}" ;;
      *) die "unknown component: $c" ;;
    esac
  done
}

run_main "$@"
