# shellcheck shell=bash
# Sourced by the local test executor's stages.
#
# record appends one line to $LOCAL_EXECUTOR_EVENTS (when set), so a test can
# see which executables the runner called, in which order and with what.
record() {
	if [ -n "${LOCAL_EXECUTOR_EVENTS:-}" ]; then
		printf '%s\n' "$*" >>"$LOCAL_EXECUTOR_EVENTS"
	fi
}
