# images-duo.sh: local stand-ins for GitLab's Duo Agent Platform flow images, sourced by
# images.sh. STAND-INS, not GitLab's images: this machine has no registry access, so the tests
# run the stock flow on images built here under the real images' names (imported into
# containerd; pods use imagePullPolicy: Never), with the same toolset as far as GitLab documents it:
#
#   registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image:v0.0.21
#       GitLab's default flow image at the tag GitLab's flows name today (IMAGE_PATH in GitLab's
#       ee/app/services/ai/duo_workflows/start_workflow_service.rb): runs as root; bash, git,
#       git-lfs, curl, Node.js and npm; SRT (@anthropic-ai/sandbox-runtime from the npm registry,
#       with what it needs on Linux: bubblewrap, socat, ripgrep); the duo CLI pre-installed (images
#       from v0.0.11 ship one; here: the stand-in of tests/duocli), so the flow skips its install.
#       The real image is Debian-based too, but its exact package list is not public here.
#   .../workflow-generic-image-hardened:v0.0.21
#       The hardened variant at the same release tag (GitLab builds both from one repository and
#       tags both per release; its HARDENED_IMAGE_PATH names the same tag as IMAGE_PATH). The real
#       one is UBI 9 minimal; this one is Debian bookworm: runs as UID 1001 (duo-runner, $HOME
#       /home/duo-runner), git, git-lfs, Node.js, npm and the duo CLI pre-installed, no SRT.
#
# The duo CLI stand-in (tests/duocli/duo.js) is what `duo run` does as far as a runner can
# see: a WebSocket session with the workflow service through the instance, then the agent's
# work (edit, test, commit, push, merge request); like duo CLI 9.29.0, `duo run` first writes its
# ripgrep into $HOME and fails if it cannot. The same file is served by the npm stand-in
# (tests/fakenpm) as @gitlab/duo-cli, for images without it that install it the way GitLab does.
# shellcheck shell=bash

DUO_IMAGE_REPO=registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image
# GitLab's tag of today: both images carry the same release tag (docs/agent-config.md says how to
# follow GitLab's next one).
DUO_FLOW_IMAGE_TAG=v0.0.21
DUO_DEFAULT_IMAGE=$DUO_IMAGE_REPO/workflow-generic-image:$DUO_FLOW_IMAGE_TAG
DUO_HARDENED_IMAGE=$DUO_IMAGE_REPO/workflow-generic-image-hardened:$DUO_FLOW_IMAGE_TAG
DUO_PACKAGES=(bash git git-lfs ca-certificates curl procps nodejs npm)
# What SRT needs on Linux (its dependency check): bubblewrap, socat, ripgrep.
DUO_SRT_PACKAGES=(bubblewrap socat ripgrep)
# The SRT version GitLab's docs install on custom images.
DUO_SRT_VERSION=0.0.20
DUO_CLI_JS=$REPO_ROOT/tests/duocli/duo.js
DUO_HARDENED_UID=1001

install_duo_packages() {
  local dir=$1
  shift
  chroot_apt "$dir" update && chroot_apt "$dir" install -y --no-install-recommends "$@" && chroot_apt "$dir" clean
}

# The duo CLI stand-in as a global npm-style install: /usr/local/bin/duo.
install_duo_cli() {
  local dir=$1
  install -D -m 0755 "$DUO_CLI_JS" "$dir/usr/local/lib/node_modules/@gitlab/duo-cli/bin/duo.js"
  ln -sf ../lib/node_modules/@gitlab/duo-cli/bin/duo.js "$dir/usr/local/bin/duo"
}

build_rootfs_duo_default() {
  local dir=$ROOTFS/duo-default log=$CLUSTER_LOG/rootfs-duo-default.log
  rm -rf "$dir"
  cp -a "$ROOTFS/base" "$dir"
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  : >"$log"
  with_progress "duo default image packages" "$log" install_duo_packages "$dir" "${DUO_PACKAGES[@]}" "${DUO_SRT_PACKAGES[@]}" ||
    { tail -n 20 "$log" >&2; die "duo default rootfs: apt-get failed"; }
  # npm in the image installs it, with the host's npm registry and CA bundle when the host has
  # npm (a registry mirror behind a private CA, say): neither is written into the image.
  local registry="" cafile=/etc/ssl/certs/ca-certificates.crt
  if command -v npm >/dev/null; then
    registry=$(npm config get registry 2>/dev/null | tail -n1)
    cafile=$(npm config get cafile 2>/dev/null | tail -n1)
    [[ -f $cafile ]] || cafile=/etc/ssl/certs/ca-certificates.crt
  fi
  cp "$cafile" "$dir/tmp/host-ca.crt"
  chroot "$dir" /usr/bin/env ${registry:+npm_config_registry=$registry} npm_config_cafile=/tmp/host-ca.crt \
    npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false \
    npm install -g "@anthropic-ai/sandbox-runtime@$DUO_SRT_VERSION" >>"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; die "duo default rootfs: npm install of SRT failed"; }
  rm -rf "$dir/tmp/host-ca.crt" "$dir/root/.npm"
  install_duo_cli "$dir"
  chroot "$dir" /bin/bash -c 'git --version && node --version && npm --version && duo --version && srt --version && bwrap --version && socat -V | head -n2 && rg --version | head -n1' >>"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; die "duo default rootfs: a required tool does not run"; }
  slim_rootfs "$dir"
}

build_rootfs_duo_hardened() {
  local dir=$ROOTFS/duo-hardened log=$CLUSTER_LOG/rootfs-duo-hardened.log
  rm -rf "$dir"
  cp -a "$ROOTFS/base" "$dir"
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  : >"$log"
  with_progress "duo hardened image packages" "$log" install_duo_packages "$dir" "${DUO_PACKAGES[@]}" ||
    { tail -n 20 "$log" >&2; die "duo hardened rootfs: apt-get failed"; }
  chroot "$dir" /usr/sbin/useradd --uid "$DUO_HARDENED_UID" --user-group --create-home --shell /bin/bash duo-runner >>"$log" 2>&1 ||
    die "duo hardened rootfs: useradd failed"
  install_duo_cli "$dir"
  chroot "$dir" /bin/bash -c 'git --version && node --version && npm --version && duo --version' >>"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; die "duo hardened rootfs: a required tool does not run"; }
  slim_rootfs "$dir"
}

# duo_recipe_stamp REF FUNCTIONS...: like recipe_stamp, plus the package lists and the CLI stand-in.
duo_recipe_stamp() {
  local ref=$1
  shift
  echo "$ref $( { declare -f "$@" install_duo_packages install_duo_cli pack_oci slim_rootfs
    echo "${DUO_PACKAGES[*]} ${DUO_SRT_PACKAGES[*]} $DUO_SRT_VERSION $SUITE"; cat "$DUO_CLI_JS"; } | sha256sum | cut -c1-16)"
}

# build_duo_image NAME REF CONFIG BUILD_FUNCTION
build_duo_image() {
  local name=$1 ref=$2 cfg=$3 fn=$4 stamp want
  stamp=$CLUSTER_IMAGES/$name.stamp
  want=$(duo_recipe_stamp "$ref" "$fn")
  if stamp_matches "$stamp" "$want" && [[ -f $CLUSTER_IMAGES/$name.tar ]]; then
    log "image $ref: up to date"
    return 0
  fi
  ensure_base_rootfs
  "$fn"
  pack_oci "$ROOTFS/$name" "$ref" "$CLUSTER_IMAGES/$name.tar" "$cfg"
  echo "$ref" >"$CLUSTER_IMAGES/$name.ref"
  stamp_write "$stamp" "$want"
}

build_duo_images() {
  step "image duo-default (stand-in)" build_duo_image duo-default "$DUO_DEFAULT_IMAGE" '"Cmd":["/bin/bash"]' build_rootfs_duo_default
  step "image duo-hardened (stand-in)" build_duo_image duo-hardened "$DUO_HARDENED_IMAGE" \
    "\"User\":\"$DUO_HARDENED_UID\",\"Cmd\":[\"/bin/bash\"]" build_rootfs_duo_hardened
}

DUO_IMAGE_NAMES=(duo-default duo-hardened)
