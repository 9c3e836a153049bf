#!/usr/bin/env bash
# run_exec of the local test executor: runs one stage script on this host.
# Called as: run.sh <script path> <stage name>
#
# A failing script is reported as the protocol wants: its exit code into
# $BUILD_EXIT_CODE_FILE (runners >= 17.9 read it) and BUILD_FAILURE_EXIT_CODE
# as our own exit code; passing the script's code through would make any
# code other than 1 a system failure.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
script=$1
stage=$2
record "run $stage job_env=${LOCAL_EXECUTOR_JOB_ENV:-}"

# Run the script as a child rather than exec it, to translate its exit code.
"$script" &
child=$!

# On cancel and timeout the runner sends SIGTERM to our whole process group.
# Pass it on to the script and to the subshell that runs its commands too (the
# script evals them in a pipeline, and bash runs a trap only once the pipeline
# is over), so that a cancel acts at once whoever gets the signal.
forward_term() {
	# shellcheck disable=SC2046 # one argument per child PID
	kill -TERM $(pgrep -P "$child" 2>/dev/null) "$child" 2>/dev/null
}
trap forward_term TERM
wait "$child"
status=$?
# A trapped signal interrupts wait; wait again for the script's own status.
while kill -0 "$child" 2>/dev/null; do
	wait "$child"
	status=$?
done

if [ "$status" -ne 0 ]; then
	if [ -n "${BUILD_EXIT_CODE_FILE:-}" ]; then
		echo "$status" >"$BUILD_EXIT_CODE_FILE"
	fi
	exit "${BUILD_FAILURE_EXIT_CODE:-1}"
fi
