#!/usr/bin/env bash
# cleanup_exec of the local test executor. Its output goes to the runner's
# own log, never to the job log.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

record "cleanup job_env=${LOCAL_EXECUTOR_JOB_ENV:-}"
echo "local test executor cleaned up"
