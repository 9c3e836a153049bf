#!/usr/bin/env bash
# images.sh: build the cluster's container images locally and import them into containerd.
#
#   images.sh build    build what is missing or outdated (no cluster needed)
#   images.sh import   import into the running containerd (k8s.io namespace) what it lacks
#
# There is no registry here: each image is a root filesystem directory packed as a single-layer
# OCI image-layout tarball; pods use imagePullPolicy: Never.
#   sandbox-executor.local/pause:3.10     static C pause binary, containerd's pinned sandbox image
#   sandbox-executor.local/ci:bookworm    Debian bookworm minbase + bash git ca-certificates procps
#                                         curl coreutils nodejs npm (what a Duo flow needs)
#   sandbox-executor.local/posix:bookworm Debian bookworm minbase with bash removed: POSIX sh (dash)
#                                         and coreutils only, to prove the executor needs no bash
#   sandbox-executor.local/sandbox-executor-agent:<hash>
#                                         this repository's stage agent and the runner's helper
#                                         (gitlab-runner-helper and its sha256, as the suites' jobs
#                                         use it: runner_helper), made by tools/images as `make
#                                         images` makes it: the image job pods mount the agent from.
#                                         Tagged by a hash of both and the image tool, so a changed
#                                         agent or helper changes the template (up.sh sets it) and
#                                         the warm pools recreate
#   sandbox-executor.local/coredns:<version>-<hash>, sandbox-executor.local/agent-sandbox-controller:<version>-<hash>
#                                         the static binaries build.sh made from the pinned modules,
#                                         alone, run as nonroot like upstream's distroless images:
#                                         cluster DNS and agent-sandbox's controller run in-cluster
#   GitLab's Duo flow images, local stand-ins under their real names: see images-duo.sh
# Each image carries a stamp: its ref plus a hash of the recipe (the functions that build it),
# so editing a recipe rebuilds that image and nothing else.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Stand-ins for GitLab's Duo flow images (build_duo_images, DUO_IMAGE_NAMES).
source "$(dirname "${BASH_SOURCE[0]}")/images-duo.sh"

SUITE=bookworm
ROOTFS=$CLUSTER_IMAGES/rootfs
CI_PACKAGES=(bash git ca-certificates procps curl coreutils nodejs npm)

# The Debian mirror the host's apt already uses (so no host name is written into this repo).
debian_mirror() {
  if [[ -n ${DEBIAN_MIRROR:-} ]]; then echo "$DEBIAN_MIRROR"; return; fi
  local m=""
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [[ -z $m && -f /etc/apt/sources.list ]]; then
    m=$(awk '$1 == "deb" && $3 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
  fi
  [[ -n $m ]] || die "cannot find the host's Debian mirror; set DEBIAN_MIRROR"
  echo "$m"
}

# recipe_stamp REF FUNCTIONS...: what an image is built from; changes when a recipe changes.
recipe_stamp() {
  local ref=$1
  shift
  echo "$ref $( { declare -f "$@"; echo "${CI_PACKAGES[*]} $SUITE"; } | sha256sum | cut -c1-16)"
}

# --- root filesystems ---------------------------------------------------------------------
build_rootfs_base() {
  local dir=$ROOTFS/base
  rm -rf "$dir"
  mkdir -p "$ROOTFS"
  : >"$CLUSTER_LOG/debootstrap-base.log"
  with_progress debootstrap "$CLUSTER_LOG/debootstrap-base.log" debootstrap --variant=minbase "$SUITE" "$dir" "$(debian_mirror)" ||
    { tail -n 20 "$CLUSTER_LOG/debootstrap-base.log" >&2; die "debootstrap failed"; }
}

# chroot_apt DIR ARGS...: apt-get inside a root filesystem, non-interactive.
chroot_apt() {
  local dir=$1
  shift
  chroot "$dir" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get -qq -o=Dpkg::Use-Pty=0 "$@"
}

# Strip what an image does not need at run time and what would leak the build host.
slim_rootfs() {
  local dir=$1
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb \
    "$dir"/debootstrap "$dir"/var/log/*.log "$dir"/tmp/* "$dir"/root/.cache
  : >"$dir/etc/resolv.conf"
  echo sandbox >"$dir/etc/hostname"
}

# Packages go in with apt inside the chroot rather than debootstrap --include: debootstrap's
# resolver leaves npm's node-* dependencies unconfigured and exits non-zero.
install_ci_packages() {
  chroot_apt "$1" update && chroot_apt "$1" install -y --no-install-recommends "${CI_PACKAGES[@]}" && chroot_apt "$1" clean
}

build_rootfs_ci() {
  local dir=$ROOTFS/ci
  rm -rf "$dir"
  cp -a "$ROOTFS/base" "$dir"
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  : >"$CLUSTER_LOG/rootfs-ci.log"
  with_progress "ci image packages" "$CLUSTER_LOG/rootfs-ci.log" install_ci_packages "$dir" ||
    { tail -n 20 "$CLUSTER_LOG/rootfs-ci.log" >&2; die "ci rootfs: apt-get failed"; }
  chroot "$dir" /bin/bash -c 'git --version && node --version && npm --version && curl --version | head -n1' >/dev/null ||
    die "ci rootfs: a required tool does not run"
  slim_rootfs "$dir"
}

# bash is Essential in Debian, so dpkg needs --force-remove-essential; nothing in minbase
# depends on it at run time (/bin/sh is dash).
build_rootfs_posix() {
  local dir=$ROOTFS/posix
  rm -rf "$dir"
  cp -a "$ROOTFS/base" "$dir"
  chroot "$dir" /usr/bin/dpkg --purge --force-remove-essential bash >"$CLUSTER_LOG/rootfs-posix.log" 2>&1 ||
    { tail -n 20 "$CLUSTER_LOG/rootfs-posix.log" >&2; die "posix rootfs: removing bash failed"; }
  [[ ! -e $dir/bin/bash && ! -e $dir/usr/bin/bash ]] || die "posix rootfs: bash still present"
  chroot "$dir" /bin/sh -c 'ls / >/dev/null && cat /etc/debian_version >/dev/null' || die "posix rootfs: sh/coreutils broken"
  slim_rootfs "$dir"
}

# The smallest possible pod sandbox image: sleeps, reaps zombies, exits on SIGINT/SIGTERM.
build_rootfs_pause() {
  local dir=$ROOTFS/pause src=$CLUSTER_IMAGES/pause.c
  rm -rf "$dir"
  mkdir -p "$dir"
  cat >"$src" <<'C'
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_term;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = on_chld;
  sa.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) pause();
}
C
  gcc -Os -static -o "$dir/pause" "$src"
  strip "$dir/pause"
}

# runner_helper: the runner's helper the suites' jobs copy or link (tests/runner HelperPath):
# $SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER, else gitlab-runner-helper beside
# $SANDBOX_EXECUTOR_GITLAB_RUNNER, else GitLab Runner 17.9.0's in ../shared/tools beside the
# repository (the Makefile's RUNNER_DIR, `make runner`).
runner_helper() {
  local runner=${SANDBOX_EXECUTOR_GITLAB_RUNNER:-$(dirname "$REPO_ROOT")/shared/tools/gitlab-runner-17.9.0/gitlab-runner}
  echo "${SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER:-$(dirname "$runner")/gitlab-runner-helper}"
}

# The agent is rebuilt from this checkout each time (a second with a warm Go cache); its hash,
# the runner's helper's and the image tool's source, not a recipe, say whether the image is
# current. The image is made by the project's own image tool (tools/images, the one `make
# images` uses, with -runner), so the local cluster runs the image users get: job pods find the
# runner's helper baked in, and prepare links it rather than copying 46 MB over exec.
build_agent_image() {
  local dir=$ROOTFS/agent bin helper hash ref digest archive
  helper=$(runner_helper)
  [[ -f $helper && -x $helper ]] ||
    die "no runner helper at $helper: put GitLab Runner 17.9.0 there (make runner), or point SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER at a gitlab-runner-helper"
  mkdir -p "$dir"
  bin=$dir/sandbox-executor-agent.new
  (cd "$REPO_ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin" ./cmd/sandbox-executor-agent) >>"$CLUSTER_LOG/build-agent.log" 2>&1 ||
    { tail -n 20 "$CLUSTER_LOG/build-agent.log" >&2; die "building the stage agent failed (log: $CLUSTER_LOG/build-agent.log)"; }
  hash=$(cat "$bin" "$helper" "$REPO_ROOT/tools/images/main.go" | sha256sum | cut -c1-12)
  ref=${AGENT_IMAGE_REPO%/*}/sandbox-executor-agent:$hash
  if [[ -f $CLUSTER_IMAGES/agent.tar && "$(cat "$CLUSTER_IMAGES/agent.ref" 2>/dev/null)" == "$ref" ]]; then
    rm -f "$bin"
    log "image $ref: up to date"
    return 0
  fi
  mv -f "$bin" "$dir/sandbox-executor-agent"
  # tools/images -runner takes a directory with gitlab-runner-helper in it, whatever the
  # helper's own name.
  rm -rf "$dir/runner" "$CLUSTER_IMAGES/agent-oci"
  mkdir -p "$dir/runner"
  ln -s "$helper" "$dir/runner/gitlab-runner-helper"
  read -r ref digest archive < <(cd "$REPO_ROOT" && go run ./tools/images -bin "$dir" -runner "$dir/runner" -only sandbox-executor-agent \
    -repo "${AGENT_IMAGE_REPO%/*}" -tag "$hash" -out "$CLUSTER_IMAGES/agent-oci" 2>>"$CLUSTER_LOG/build-agent.log" | grep -v '^base ') ||
    { tail -n 20 "$CLUSTER_LOG/build-agent.log" >&2; die "packing the agent image failed (log: $CLUSTER_LOG/build-agent.log)"; }
  mv -f "$archive" "$CLUSTER_IMAGES/agent.tar"
  echo "$digest" >"$CLUSTER_IMAGES/agent.digest"
  echo "$ref" >"$CLUSTER_IMAGES/agent.ref"
  log "packed $ref: $(du -h "$CLUSTER_IMAGES/agent.tar" | cut -f1), manifest ${digest:0:19}, with the runner's helper $helper (sha256 $(sha256sum "$helper" | cut -c1-12)…)"
}

# component_image NAME REPO VERSION BINARY USER: an image of one static binary from $CLUSTER_BIN,
# tagged VERSION-<binary hash>: a rebuilt binary repacks it under a new tag.
component_image() {
  local name=$1 bin=$CLUSTER_BIN/$4 user=$5 dir=$ROOTFS/$1 ref want
  [[ -x $bin ]] || die "$bin not built: run build.sh"
  ref=$2:$3-$(sha256sum "$bin" | cut -c1-12)
  want="$ref $(declare -f component_image pack_oci | sha256sum | cut -c1-16)"
  if stamp_matches "$CLUSTER_IMAGES/$name.stamp" "$want" && [[ -f $CLUSTER_IMAGES/$name.tar ]]; then
    log "image $ref: up to date"
    return 0
  fi
  rm -rf "$dir"
  mkdir -p "$dir/tmp"
  chmod 1777 "$dir/tmp"
  cp "$bin" "$dir/$4"
  pack_oci "$dir" "$ref" "$CLUSTER_IMAGES/$name.tar" "\"Entrypoint\":[\"/$4\"],\"User\":\"$user\""
  echo "$ref" >"$CLUSTER_IMAGES/$name.ref"
  stamp_write "$CLUSTER_IMAGES/$name.stamp" "$want"
}

# --- OCI packing ----------------------------------------------------------------------------
# blob DIR FILE: move FILE into DIR/blobs/sha256 under its digest; print "digest size".
blob() {
  local d s
  d=$(sha256sum "$2" | cut -d' ' -f1)
  s=$(stat -c %s "$2")
  mv "$2" "$1/blobs/sha256/$d"
  echo "$d $s"
}

# pack_oci ROOTFS_DIR REF OUT_TAR CONFIG_JSON_FRAGMENT: one uncompressed layer (an uncompressed
# layer imports fastest: containerd does not need to decompress it).
pack_oci() {
  local src=$1 ref=$2 out=$3 cfg=$4 w layer_d layer_s conf_d conf_s manifest_d manifest_s
  w=$(mktemp -d "$CLUSTER_IMAGES/.pack.XXXXXX")
  mkdir -p "$w/blobs/sha256"
  tar --numeric-owner --xattrs --xattrs-include='*' -C "$src" -cf "$w/layer.tar" .
  read -r layer_d layer_s < <(blob "$w" "$w/layer.tar")
  printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"sandbox-executor tests/cluster/images.sh"}]}' \
    "$cfg" "$layer_d" >"$w/config.json"
  read -r conf_d conf_s < <(blob "$w" "$w/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$conf_d" "$conf_s" "$layer_d" "$layer_s" >"$w/manifest.json"
  read -r manifest_d manifest_s < <(blob "$w" "$w/manifest.json")
  [[ -n $layer_d && -n $conf_d && -n $manifest_d ]] || die "packing $ref failed"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$w/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_d" "$manifest_s" "$ref" "${ref##*:}" >"$w/index.json"
  tar -C "$w" -cf "$out.tmp" oci-layout index.json blobs
  mv -f "$out.tmp" "$out"
  echo "sha256:$manifest_d" >"${out%.tar}.digest"
  rm -rf "$w"
  log "packed $ref: $(du -h "$out" | cut -f1), manifest sha256:${manifest_d:0:12}"
}

# --- the images -----------------------------------------------------------------------------
# image_* NAME: build the tarball $CLUSTER_IMAGES/NAME.tar unless its stamp is current.
build_image() {
  local name=$1 ref=$2 cfg=$3
  shift 3
  local stamp want
  stamp=$CLUSTER_IMAGES/$name.stamp
  want=$(recipe_stamp "$ref" "$@" pack_oci slim_rootfs)
  if stamp_matches "$stamp" "$want" && [[ -f $CLUSTER_IMAGES/$name.tar ]]; then
    log "image $ref: up to date"
    return 0
  fi
  local fn
  for fn in "$@"; do "$fn"; done
  pack_oci "$ROOTFS/$name" "$ref" "$CLUSTER_IMAGES/$name.tar" "$cfg"
  echo "$ref" >"$CLUSTER_IMAGES/$name.ref"
  stamp_write "$stamp" "$want"
}

ensure_base_rootfs() {
  local stamp=$ROOTFS/base.stamp want
  want=$(recipe_stamp "debootstrap $SUITE minbase" build_rootfs_base)
  if stamp_matches "$stamp" "$want" && [[ -x $ROOTFS/base/bin/sh ]]; then return 0; fi
  step "debootstrap $SUITE minbase" build_rootfs_base
  stamp_write "$stamp" "$want"
}

build_all() {
  ensure_dirs
  mkdir -p "$ROOTFS"
  step "image pause" build_image pause "$PAUSE_IMAGE" '"Entrypoint":["/pause"]' build_rootfs_pause
  # The base is only needed when the ci or posix image must be (re)built.
  if ! stamp_matches "$CLUSTER_IMAGES/ci.stamp" "$(recipe_stamp "$CI_IMAGE" build_rootfs_ci pack_oci slim_rootfs)" ||
    ! stamp_matches "$CLUSTER_IMAGES/posix.stamp" "$(recipe_stamp "$POSIX_IMAGE" build_rootfs_posix pack_oci slim_rootfs)"; then
    ensure_base_rootfs
  fi
  step "image ci" build_image ci "$CI_IMAGE" '"Cmd":["/bin/bash"]' build_rootfs_ci
  step "image posix" build_image posix "$POSIX_IMAGE" '"Cmd":["/bin/sh"]' build_rootfs_posix
  step "image agent" build_agent_image
  # CoreDNS binds :53, which needs root with only CAP_NET_BIND_SERVICE (its Deployment drops the rest).
  step "image coredns" component_image coredns "$COREDNS_IMAGE_REPO" "$COREDNS_VERSION" coredns 0:0
  step "image agent-sandbox-controller" component_image agent-sandbox-controller "$AGENT_SANDBOX_IMAGE_REPO" "$AGENT_SANDBOX_VERSION" \
    agent-sandbox-controller 65532:65532
  build_duo_images
}

# --- import ---------------------------------------------------------------------------------
# imported_digest REF: the manifest digest containerd has for REF (empty if none).
imported_digest() {
  ctr_k8s images ls "name==$1" 2>/dev/null | awk 'NR == 2 {print $3}'
}

import_one() {
  local name=$1 ref want
  ref=$(cat "$CLUSTER_IMAGES/$name.ref")
  want=$(cat "$CLUSTER_IMAGES/$name.digest")
  if [[ "$(imported_digest "$ref")" == "$want" ]]; then
    log "image $ref: already in containerd"
    return 0
  fi
  ctr_k8s images import "$CLUSTER_IMAGES/$name.tar" >/dev/null
  # Pinned: kubelet's image garbage collection must never delete an image it cannot pull back.
  ctr_k8s images label "$ref" io.cri-containerd.pinned=pinned >/dev/null
  [[ "$(imported_digest "$ref")" == "$want" ]] || die "import of $ref did not produce $want"
  log "imported $ref"
}

import_all() {
  local name
  for name in pause ci posix agent coredns agent-sandbox-controller "${DUO_IMAGE_NAMES[@]}"; do
    [[ -f $CLUSTER_IMAGES/$name.tar ]] || die "image $name not built: run images.sh build"
    step "import $name" import_one "$name"
  done
}

# import_archives DIR: the images `make images` wrote (DIR/images.json), into the running
# containerd; without a local cluster there is nothing to import into, and that is no error.
import_archives() {
  local dir=$1 ref digest archive
  [[ -f $dir/images.json ]] || die "no $dir/images.json: run tools/images first"
  if [[ ! -S $CONTAINERD_SOCK ]]; then
    log "no local cluster (containerd socket $CONTAINERD_SOCK): images left in $dir"
    return 0
  fi
  while read -r ref digest archive; do
    if [[ "$(imported_digest "$ref")" == "$digest" ]]; then
      log "image $ref: already in containerd"
      continue
    fi
    ctr_k8s images import "$dir/$archive" >/dev/null
    ctr_k8s images label "$ref" io.cri-containerd.pinned=pinned >/dev/null
    [[ "$(imported_digest "$ref")" == "$digest" ]] || die "import of $ref did not produce $digest"
    log "imported $ref $digest"
  done < <(python3 -c 'import json,sys; [print(i["ref"], i["digest"], i["archive"]) for i in json.load(open(sys.argv[1]))["images"]]' "$dir/images.json")
}

main() {
  case ${1:-} in
    build) build_all ;;
    import) import_all ;;
    import-archives) import_archives "${2:?usage: images.sh import-archives DIR}" ;;
    *) die "usage: images.sh build|import|import-archives DIR" ;;
  esac
}

run_main "$@"
