#!/usr/bin/env bash
# config_exec of the local test executor, which runs jobs on this host.
# Its stdout is the JSON the runner reads; the runner adds job_env to the
# environment of the later executables (prepare, run, cleanup), not the job's.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
: "${LOCAL_EXECUTOR_DIR:?must name a scratch directory for builds and caches}"

record config
cat <<JSON
{
  "builds_dir": "$LOCAL_EXECUTOR_DIR/builds",
  "cache_dir": "$LOCAL_EXECUTOR_DIR/cache",
  "builds_dir_is_shared": false,
  "driver": {"name": "local-test-executor", "version": "1.0"},
  "job_env": {"LOCAL_EXECUTOR_JOB_ENV": "from-config-exec"}
}
JSON
