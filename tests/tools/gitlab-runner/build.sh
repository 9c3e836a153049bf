#!/usr/bin/env bash
# Builds the real GitLab Runner pinned in ./go.mod (12.8.0-pre) into
#   ${SANDBOX_EXECUTOR_CACHE:-$HOME/.cache/sandbox-executor}/bin/gitlab-runner
# and prints that path on stdout (everything else goes to stderr), so callers can do
#   export SANDBOX_EXECUTOR_GITLAB_RUNNER="$(tests/tools/gitlab-runner/build.sh)"
#
# The build takes a couple of minutes on a cold module cache, so it is skipped
# when a stamp says the binary was built from the same go.mod/go.sum/build.sh.
# Set FORCE=1 to rebuild anyway.
set -euo pipefail

readonly runner_module=gitlab.com/gitlab-org/gitlab-runner
# What `gitlab-runner --version` reports. The pinned pseudo-version is commit
# 8e5683f82927 of 2020-01-10 on the 12.8 development branch.
readonly runner_version=12.8.0-pre
readonly runner_revision=8e5683f8
readonly runner_branch=master
readonly runner_built=2020-01-10T01:48:30+00:00

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_dir=${SANDBOX_EXECUTOR_CACHE:-$HOME/.cache/sandbox-executor}
bin_dir=$cache_dir/bin
binary=$bin_dir/gitlab-runner
stamp_file=$bin_dir/.gitlab-runner.stamp

cd "$script_dir"

module_version=$(go list -mod=readonly -m -f '{{.Version}}' "$runner_module")
# The stamp covers everything that decides what gets built, including the
# toolchain, so a bumped dependency or Go release triggers a rebuild.
stamp="$runner_module@$module_version $(go env GOVERSION) $(cat go.mod go.sum build.sh | sha256sum | cut -d' ' -f1)"

if [[ "${FORCE:-0}" != 1 && -x "$binary" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
	echo "gitlab-runner $runner_version is up to date at $binary" >&2
else
	echo "building gitlab-runner $runner_version ($runner_module@$module_version) into $binary ..." >&2
	mkdir -p "$bin_dir"
	common=$runner_module/common
	# Stripped (-s -w): the same binary is copied into job pods that use cache or
	# artifacts (helper_binary), 32 MB instead of 45 MB.
	ldflags="-s -w -X $common.NAME=gitlab-runner -X $common.VERSION=$runner_version"
	ldflags+=" -X $common.REVISION=$runner_revision -X $common.BRANCH=$runner_branch"
	ldflags+=" -X $common.BUILT=$runner_built"
	# Static (no cgo), so the same binary can also be copied into a job
	# environment, where the cache and artifact stages call it.
	tmp_binary=$(mktemp "$bin_dir/.gitlab-runner.XXXXXX")
	trap 'rm -f "$tmp_binary"' EXIT
	CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$tmp_binary" "$runner_module"
	mv -f "$tmp_binary" "$binary"
	trap - EXIT
	printf '%s\n' "$stamp" >"$stamp_file"
fi

# Never trust a stamp alone: the binary must run and report the pinned version.
version_output=$("$binary" --version 2>&1)
if ! grep -q "^Version: *$runner_version\$" <<<"$version_output"; then
	echo "unexpected 'gitlab-runner --version' output from $binary:" >&2
	echo "$version_output" >&2
	exit 1
fi
echo "$version_output" | head -n 2 >&2
echo "$binary"
