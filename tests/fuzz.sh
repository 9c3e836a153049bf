#!/usr/bin/env bash
# fuzz.sh: make fuzz, and make unit's fuzz smoke. Every fuzz target in the module (a `func Fuzz`
# line in a _test.go file) fuzzed for FUZZTIME with the go command FUZZ_GO (the Makefile says why
# that is Go 1.27.3), FUZZ_JOBS targets at a time (default 2). Exits non-zero, naming them, when
# a target fails (a crasher, saved under the package's testdata/fuzz/<target>/ as go test saves
# it) or a package's fuzzing build fails; the other targets still run.
#
# Why not `go test -fuzz` per target, as the Makefile did: go test links the package's
# fuzz-instrumented test binary again for every target (2 to 8 s each, as busy as the machine
# is; 24 targets in 10 packages) and fuzzes one target at a time. Here:
# - each package's binary is built once (`go test -c -fuzz=.`), one build at a time, the next
#   while the previous packages' targets fuzz;
# - its targets run as go test runs them: from the package's directory (so a crasher goes to the
#   package's testdata/fuzz/<target>/), with go test's -test.fuzzcachedir
#   ($GOCACHE/fuzz/<import path>: `go test -fuzz` and this script each start from the corpus the
#   other found), -test.paniconexit0 and -test.timeout=10m0s (it bounds the seed run, not the
#   fuzzing);
# - FUZZ_JOBS targets fuzz at once, each with nproc/FUZZ_JOBS workers (-test.parallel; go test's
#   default is GOMAXPROCS). Each target still fuzzes for FUZZTIME, but with 2 jobs on 2 cores on
#   one core rather than both, and less while a build runs; FUZZ_JOBS=1 gives each target every
#   core, for more wall time (the Makefile's fuzz target has the figures).
# -vet=off: make lint vets the tree (the Makefile's fuzz target says why not again here).
#
# Output: a line when a package is built and when a target starts, and each target's whole
# output, indented, under a line with its result when it ends, so two targets' lines never mix.
# Status lines carry the time since the start.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fuzztime=${FUZZTIME:?FUZZTIME is unset}
read -ra gocmd <<<"${FUZZ_GO:-go}"
jobs=${FUZZ_JOBS:-2}
workers=$(($(nproc) / jobs))
((workers > 0)) || workers=1

# The targets (tname, and tpkg: their package's index in pkgs), in the order of their files
# (sorted) and of their lines.
pkgs=() tpkg=() tname=() left=()
declare -A pkgindex=()
while read -r file; do
  dir=$(dirname "$file")
  while read -r target; do
    if [[ -z ${pkgindex[$dir]:-} ]]; then
      pkgindex[$dir]=${#pkgs[@]}
      pkgs+=("$dir")
    fi
    p=${pkgindex[$dir]}
    tpkg+=("$p")
    tname+=("$target")
    left[p]=$((${left[p]:-0} + 1))
  done < <(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file")
done < <(grep -rl --include='*_test.go' --exclude-dir=.git '^func Fuzz' . | sort)
ntargets=${#tname[@]}
npkgs=${#pkgs[@]}
if ((ntargets == 0)); then
  echo "fuzz: no fuzz targets found" >&2
  exit 1
fi

# Each package's import path, for its fuzz cache directory.
gocache=$("${gocmd[@]}" env GOCACHE)
declare -A importpath=()
while read -r dir path; do importpath[$dir]=$path; done < <("${gocmd[@]}" list -f '{{.Dir}} {{.ImportPath}}' "${pkgs[@]}")
pkgpath=()
for p in "${!pkgs[@]}"; do
  dir=${pkgs[p]}
  pkgpath[p]=${importpath[$PWD/${dir#./}]:?"go list did not name $dir"}
done

work=$(mktemp -d)
declare -A running=() # pid -> build:<package index> or fuzz:<target index>
cleanup() {
  local pid
  for pid in "${!running[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now() { echo "${EPOCHREALTIME/[.,]/}"; } # microseconds
since() { local d=$(($(now) - $1)); printf '%d.%01ds' $((d / 1000000)) $((d / 100000 % 10)); }
say() { echo "[$(since "$began")] $*"; }
indent() { sed 's/^/    /' "$1"; }

began=$(now)
echo "fuzzing with $("${gocmd[@]}" env GOVERSION): $ntargets targets in $npkgs packages, $fuzztime each, $jobs at a time with $workers worker(s) each"
pstate=() pstart=() tstart=() failed=()
next_build=0 building=0 next_fuzz=0 fuzzing=0

start_build() {
  local p=$1
  pstart[p]=$(now)
  "${gocmd[@]}" test -c -vet=off -fuzz=. -o "$work/$p.test" "${pkgs[p]}" >"$work/$p.build.log" 2>&1 &
  running[$!]=build:$p
  building=1
}

start_fuzz() {
  local t=$1 p=${tpkg[$1]}
  tstart[t]=$(now)
  say "start ${pkgs[p]} ${tname[t]}"
  (cd "${pkgs[p]}" && exec "$work/$p.test" -test.paniconexit0 -test.timeout=10m0s -test.run='^$' \
    -test.fuzz="^${tname[t]}\$" -test.fuzztime="$fuzztime" -test.parallel="$workers" \
    -test.fuzzcachedir="$gocache/fuzz/${pkgpath[p]}") >"$work/$t.log" 2>&1 &
  running[$!]=fuzz:$t
  fuzzing=$((fuzzing + 1))
}

# Reports a job that ended: a build's output only when it failed, a target's whole output.
finished() {
  local what=$1 status=$2 p t result crasher
  case $what in
  build:*)
    p=${what#build:}
    building=0
    if ((status == 0)); then
      pstate[p]=built
      say "built ${pkgs[p]} in $(since "${pstart[p]}")"
    else
      pstate[p]=failed
      say "=== build ${pkgs[p]}: FAIL (exit $status) in $(since "${pstart[p]}")"
      indent "$work/$p.build.log"
    fi
    ;;
  fuzz:*)
    t=${what#fuzz:}
    p=${tpkg[t]}
    fuzzing=$((fuzzing - 1))
    result=ok
    if ((status != 0)); then
      result="FAIL (exit $status)"
    elif grep -q '^testing: warning: ' "$work/$t.log"; then
      result="FAIL (not fuzzed)" # no fuzz test, or more than one, matched: the binary exits 0
      status=1
    fi
    say "=== ${pkgs[p]} ${tname[t]}: $result in $(since "${tstart[t]}")"
    indent "$work/$t.log"
    if ((status != 0)); then
      crasher=$(sed -n 's|.*Failing input written to testdata/fuzz/\([^ ]*\).*|\1|p' "$work/$t.log" | head -1)
      failed+=("${pkgs[p]} ${tname[t]}${crasher:+: crasher ${pkgs[p]}/testdata/fuzz/$crasher; go test -run=$crasher ${pkgs[p]}}")
    fi
    left[p]=$((left[p] - 1))
    if ((left[p] == 0)); then rm -f "$work/$p.test"; fi
    ;;
  esac
}

while ((next_fuzz < ntargets)) || ((${#running[@]} > 0)); do
  if ((!building && next_build < npkgs)); then
    start_build "$next_build"
    next_build=$((next_build + 1))
  fi
  while ((next_fuzz < ntargets && fuzzing < jobs)); do
    p=${tpkg[next_fuzz]}
    case ${pstate[p]:-} in
    built) start_fuzz "$next_fuzz" ;;
    failed) failed+=("${pkgs[p]} ${tname[next_fuzz]}: its package did not build") ;;
    *) break ;; # its build has not ended yet
    esac
    next_fuzz=$((next_fuzz + 1))
  done
  ((${#running[@]} > 0)) || continue
  status=0
  wait -n -p pid "${!running[@]}" || status=$?
  what=${running[$pid]}
  unset "running[$pid]"
  finished "$what" "$status"
done

if ((${#failed[@]} > 0)); then
  echo "fuzz: FAILED, ${#failed[@]} of $ntargets targets, in $(since "$began"):"
  printf '    %s\n' "${failed[@]}"
  exit 1
fi
echo "fuzz: $ntargets targets passed in $(since "$began")"
