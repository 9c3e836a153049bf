#!/usr/bin/env bash
# run.sh: the control-plane scale bench (make bench-scale): fake nodes up, the bench, fake nodes
# down again whatever happens. Arguments go to the bench (tools/scale/main.go), e.g.
#   tools/scale/run.sh -warm 100 -cold '' -out /tmp/scale.md
# Ctrl-C stops the rounds; the bench still deletes its namespace before the nodes go.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../../tests/cluster/lib.sh"
bin=$CLUSTER_DIR/kwok/scale-bench
mkdir -p "$(dirname "$bin")"
# A built binary, not `go run`: the signal must reach the bench itself.
(cd "$REPO_ROOT" && go build -o "$bin" ./tools/scale)
trap '"$here/kwok.sh" down' EXIT
"$here/kwok.sh" up
"$bin" "$@"
