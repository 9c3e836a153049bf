#!/usr/bin/env bash
# lint-test-names.sh: in-package test files (package x, in a package with code) are named
# x_internal_test.go (or x_internal_GOOS_test.go; export_test.go exports names to external tests):
# tests/README.md#conventions. Prints the files that are not, and fails if any.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
bad=0
for f in $(git ls-files '*_test.go'); do
  [[ $f =~ _internal(_[a-z0-9]+)?_test\.go$ || $(basename "$f") == export_test.go ]] && continue
  pkg=$(sed -n 's/^package \([a-z0-9_]*\)$/\1/p' "$f" | head -1)
  [[ -z $pkg || $pkg == *_test ]] && continue
  ls "$(dirname "$f")"/*.go | grep -qv '_test\.go$' || continue
  echo "in-package test not named *_internal_test.go: $f"
  bad=1
done
exit $bad
