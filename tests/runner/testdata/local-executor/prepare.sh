#!/usr/bin/env bash
# prepare_exec of the local test executor: nothing to create on this host;
# it records what the runner told it.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

record "prepare job=${CUSTOM_ENV_CI_JOB_ID:-} image=${CUSTOM_ENV_CI_JOB_IMAGE:-}" \
	"response_file=${JOB_RESPONSE_FILE:+set} exit_code_file=${BUILD_EXIT_CODE_FILE:+set}" \
	"job_env=${LOCAL_EXECUTOR_JOB_ENV:-}"
echo "Prepared the local environment"
