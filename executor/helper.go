package executor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

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

// InstallHelper puts the runner's helper binary (path, on this host; empty: nothing to do) on
// the pod's stage PATH as BinDir/gitlab-runner: cache and artifacts then work in any image
// without rebuilding it. A pod of the chart's templates has the helper baked in (copied from the
// agent image by its init container, wire.BakedHelperPath): if its sha256 is the runner's own
// helper's, the agent links it there and nothing is copied. agent asks the agent that (the
// stages' executor: over the pod network when the job's stages go there), exec copies the
// helper otherwise (no baked helper, another build of it, an agent too old to say), streamed in
// over exec stdin (tens of MB, about a second or more). The job log says which, and how long it
// took. Jobs known to have no cache and no artifacts skip both.
func InstallHelper(ctx context.Context, agent, exec kube.RemoteExecutor, sbx *kube.Sandbox, path string, job *gitlab.Job, log *gitlab.JobLog) error {
	if path == "" {
		return nil
	}
	if !job.NeedsHelper {
		log.Debugf("The job has no cache and no artifacts: the runner helper is not copied")
		return nil
	}
	start := log.Now()
	digest, err := HelperDigest(path)
	if err != nil {
		return failure.PermanentError(nil, "helper_binary %s: %v", path, failure.WithoutPath(err))
	}
	if useBakedHelper(ctx, agent, exec, sbx, digest, log) {
		log.Infof("Runner helper: baked in the pod (sha256 %s…), checked and linked as %s/%s in %s",
			digest[:12], wire.BinDir, HelperName, gitlab.Millis(log.Now().Sub(start)))
		return nil
	}
	start = log.Now()
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
	err = exec.Exec(ctx, kube.ExecRequest{
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

// useBakedHelper asks the pod's agent whether the helper baked into the pod is the one with
// digest, which it then links on the stages' PATH: through agent, and through exec if agent
// fails (an agent older than the check over the pod network refuses it there). Anything but a
// match copies the helper: a mismatch says so in the job log, the rest (none baked, an agent
// that does not know the command) only in its debug lines.
func useBakedHelper(ctx context.Context, agent, exec kube.RemoteExecutor, sbx *kube.Sandbox, digest string, log *gitlab.JobLog) bool {
	var stdout, stderr bytes.Buffer
	ask := func(ex kube.RemoteExecutor) error {
		stdout.Reset()
		stderr.Reset()
		return ex.Exec(ctx, kube.ExecRequest{
			Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container,
			Command: wire.HelperArgs(digest, wire.BinDir+"/"+HelperName),
			Stdout:  &stdout,
			Stderr:  &stderr,
		})
	}
	err := ask(agent)
	if _, overNetwork := agent.(*AgentNetwork); err != nil && overNetwork {
		log.Debugf("The agent in pod %s did not check the baked runner helper over the pod network (%s): asking over exec", sbx.Pod, failure.OneLine(strings.TrimSpace(stderr.String()+" "+err.Error())))
		err = ask(exec)
	}
	if err != nil {
		log.Debugf("No baked runner helper checked in pod %s (%s): copying it", sbx.Pod, failure.OneLine(strings.TrimSpace(stderr.String()+" "+err.Error())))
		return false
	}
	answer := strings.Fields(stdout.String())
	switch {
	case len(answer) == 2 && answer[0] == wire.HelperBaked && answer[1] == digest:
		return true
	case len(answer) == 2 && answer[0] == wire.HelperMismatch:
		log.Warnf("The runner helper baked in pod %s (sha256 %s…) is not this runner's (sha256 %s…): copying this runner's; the agent image and the runner's gitlab-runner-helper differ", sbx.Pod, short(answer[1]), digest[:12])
	case len(answer) == 1 && answer[0] == wire.HelperAbsent:
		log.Debugf("No runner helper baked in pod %s: copying it", sbx.Pod)
	default:
		log.Debugf("The agent in pod %s answered %q about a baked runner helper: copying it", sbx.Pod, failure.OneLine(stdout.String()))
	}
	return false
}

func short(digest string) string { return digest[:min(12, len(digest))] }

// helperDigests caches the sha256 of helper binaries on this host, by path, size and
// modification time: the stage server computes it once, not at every prepare.
var helperDigests sync.Map

type helperKey struct {
	path  string
	size  int64
	mtime time.Time
}

// HelperDigest is the sha256 (hex) of the helper binary at path, cached while the file's size
// and modification time stay the same.
func HelperDigest(path string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	key := helperKey{path, info.Size(), info.ModTime()}
	if d, ok := helperDigests.Load(key); ok {
		return d.(string), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	d := hex.EncodeToString(h.Sum(nil))
	helperDigests.Store(key, d)
	return d, nil
}
