package executor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// HelperName is what the runner calls in the cache and artifacts stages (`gitlab-runner
// cache-extractor`, `gitlab-runner artifacts-uploader`, ...), whatever the file is named here.
const HelperName = "gitlab-runner"

// helperScript receives the helper binary into BinDir, which the agent puts first on every
// stage's PATH.
const helperScript = receiveFile + `umask 077 && mkdir -p "$1" && receive "$1/` + HelperName + `" "$2"`

// InstallHelper copies the runner's helper binary (path, on this host; empty: nothing to do)
// into the pod as BinDir/gitlab-runner, streamed over exec stdin, and says in the job log how
// long that took: cache and artifacts then work in any image without rebuilding it. Jobs known
// to have no cache and no artifacts skip the copy (tens of MB, about a second or more).
func InstallHelper(ctx context.Context, ex kube.RemoteExecutor, sbx *kube.Sandbox, path string, job *gitlab.Job, log *gitlab.JobLog) error {
	if path == "" {
		return nil
	}
	if !job.NeedsHelper {
		log.Debugf("The job has no cache and no artifacts: the runner helper is not copied")
		return nil
	}
	start := log.Now()
	file, err := os.Open(path)
	if err != nil {
		return failure.PermanentError(nil, "helper_binary %s: %v", path, failure.WithoutPath(err))
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return failure.PermanentError(nil, "helper_binary %s: %v", path, failure.WithoutPath(err))
	}
	var stderr bytes.Buffer
	err = ex.Exec(ctx, kube.ExecRequest{
		Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container,
		Command: []string{"/bin/sh", "-c", helperScript, "sh", wire.BinDir, strconv.FormatInt(info.Size(), 10)},
		Stdin:   file,
		Stdout:  io.Discard,
		Stderr:  &stderr,
	})
	if err := installError(err, &stderr, sbx, "the helper binary "+path); err != nil {
		return err
	}
	log.Infof("Copied the runner helper (%s, %s) into the pod as %s/%s in %s",
		path, megabytes(info.Size()), wire.BinDir, HelperName, gitlab.Millis(log.Now().Sub(start)))
	return nil
}

func megabytes(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
