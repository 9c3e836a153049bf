#!/usr/bin/env bash
# run.sh: the control-plane scale bench (make bench-scale): fake nodes up, the bench, fake nodes
# down again whatever happens. Arguments go to the bench (tests/scale/main.go), e.g.
#   tests/scale/run.sh -warm 100 -cold '' -out /tmp/scale.md
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../cluster/lib.sh"
trap '"$here/kwok.sh" down' EXIT
"$here/kwok.sh" up
cd "$REPO_ROOT"
go run ./tests/scale "$@"
