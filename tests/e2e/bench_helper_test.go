//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

// BenchmarkHelperPrepare measures what the runner's helper (gitlab-runner-helper, about 46 MB)
// adds to a warm prepare, against a hello job's prepare (no cache, no artifacts: no helper)
// measured in the same run: a job with cache and artifacts whose pod has the helper baked in
// (the runner's helper_binary has the baked one's sha256: prepare checks and links it), and the
// same job when it does not (helper_binary another build of the helper, as after a runner
// upgrade without the agent image's: prepare copies it over exec). All three interleaved, each
// from a full pool of pods that have the helper baked in, through the stage launcher and the
// stage server (the chart's default; the server hashes helper_binary once, not per prepare).
// Each sample must have taken the path its series names (the helper's job log line).
func BenchmarkHelperPrepare(b *testing.B) {
	helper, err := runner.HelperPath()
	if err != nil {
		b.Fatal(err)
	}
	c := clusterjobs.Connect(b)
	const pool = "bench-helper"
	benchPoolOn(b, c, pool, bakedHelperTemplate(b, c, pool, helper), 2)
	served := func(prefix, helper string) *clusterjobs.Runner {
		return c.NewServedRunner(b, prefix, localcluster.Config{Pools: localcluster.Pools(pool), Extra: fmt.Sprintf("helper_binary = %q", helper)})
	}
	sameHelper, otherHelper := served("e2e-helper-same", helper), served("e2e-helper-other", anotherBuildOf(b, helper))
	withArchives := func(r *clusterjobs.Runner) *clusterjobs.Job {
		return r.NewJob(b, clusterjobs.JobSpec{Image: ciImage, Token: jobToken,
			Cache:     []fakegitlab.Cache{{Key: "deps", Policy: "pull-push", Paths: []string{"vendor/"}}},
			Artifacts: []fakegitlab.Artifact{{Name: "report", Paths: []string{"report.txt"}, When: "on_success", Type: "archive", Format: "zip"}}})
	}
	var hello, baked, copied, checked, copying samples
	for i := 0; i < benchN(10); i++ { // interleaved, each from a full pool
		took, _ := helperPrepare(b, c, pool, newJob(b, sameHelper, ciImage), helperNone)
		hello = append(hello, took)
		took, step := helperPrepare(b, c, pool, withArchives(sameHelper), helperBakedIn)
		baked, checked = append(baked, took), append(checked, step)
		took, step = helperPrepare(b, c, pool, withArchives(otherHelper), helperCopiedIn)
		copied, copying = append(copied, took), append(copying, step)
	}
	report(b, "hello job prepare (no helper)", hello, 0)
	report(b, "cache+artifacts prepare, helper baked", baked, hello.median())
	report(b, "  of which helper check and link", checked, 0)
	report(b, "cache+artifacts prepare, helper copied", copied, hello.median())
	report(b, "  of which helper copy", copying, 0)
	b.ReportMetric(float64(baked.median())/float64(hello.median()), "baked/hello")
	b.ReportMetric(float64(copied.median())/float64(hello.median()), "copied/hello")
}

// helperPath is how prepare gave the pod the runner's helper, by its job log line.
type helperPath string

const (
	helperNone     helperPath = "no helper"
	helperBakedIn  helperPath = "helper baked in the pod"
	helperCopiedIn helperPath = "helper copied into the pod"
)

// helperPrepare waits for the pool to be full, runs prepare of j and its cleanup, and returns
// prepare's duration and the time its helper line gives (0 without one); it fails unless
// prepare took the path want.
func helperPrepare(b *testing.B, c *clusterjobs.Cluster, pool string, j *clusterjobs.Job, want helperPath) (time.Duration, time.Duration) {
	b.Helper()
	waitPoolFull(b, c, pool)
	took, log, cleanup := prepareLogOf(b, j)
	cleanup()
	linked, copiedLine := helperBaked.FindStringSubmatch(log), helperCopied.FindStringSubmatch(log)
	got, step := helperNone, time.Duration(0)
	switch {
	case linked != nil && copiedLine != nil:
		b.Fatalf("job %d: prepare both linked and copied the helper:\n%s", j.ID, log)
	case linked != nil:
		got, step = helperBakedIn, msOf(strings.TrimSuffix(linked[2], " ms"))
	case copiedLine != nil:
		got, step = helperCopiedIn, msOf(strings.TrimSuffix(copiedLine[2], " ms"))
	}
	if got != want {
		b.Fatalf("job %d: prepare took %q, want %q:\n%s", j.ID, got, want, log)
	}
	if want == helperCopiedIn && !strings.Contains(log, "is not this runner's") {
		b.Fatalf("job %d: the helper was copied, but not for the baked one's mismatch:\n%s", j.ID, log)
	}
	return took, step
}

// bakedHelperTemplate creates a copy of the local SandboxTemplate, named name, whose init
// container installs from an agent image that carries helper, as the chart's templates do with
// the images `make images` builds (tools/images -runner): the pod then has the helper and its
// sha256 beside the agent before it is claimed. deploy/local's agent image carries a helper too
// (tests/cluster/images.sh), the one the cluster was brought up with and beside the agent of
// that checkout; the image is built here instead, from $SANDBOX_EXECUTOR_BIN's agent and
// helper, so that the benchmark measures the build under test whatever the cluster runs, and
// imported into the node's containerd. The template and the image go when the benchmark ends.
// It returns the template's name.
func bakedHelperTemplate(b *testing.B, c *clusterjobs.Cluster, name, helper string) string {
	b.Helper()
	ctx := context.Background()
	root, err := testutil.ModuleRoot()
	if err != nil {
		b.Fatal(err)
	}
	runnerDir, out := b.TempDir(), b.TempDir()
	if err := os.Symlink(helper, filepath.Join(runnerDir, runner.HelperBinaryName)); err != nil {
		b.Fatal(err)
	}
	const repo, tag = "sandbox-executor.local", "bench-baked-helper"
	ref := repo + "/sandbox-executor-agent:" + tag
	build := exec.Command("go", "run", "./tools/images", "-bin", c.BinDir, "-runner", runnerDir,
		"-only", "sandbox-executor-agent", "-repo", repo, "-tag", tag, "-out", out)
	build.Dir = root
	if built, err := build.CombinedOutput(); err != nil || !strings.Contains(string(built), ref+" ") {
		b.Fatalf("tools/images: %v\n%s", err, built)
	}
	b.Cleanup(func() { removeImage(b, c, ref) })
	if _, err := clusterjobs.ClusterScript(ctx, "images.sh", nil, "import-archives", out); err != nil {
		b.Fatalf("importing %s: %v", ref, err)
	}

	templates := c.Admin.Extensions.ExtensionsV1beta1().SandboxTemplates(namespace)
	base, err := templates.Get(ctx, localcluster.Template, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	tmpl := &extv1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: base.Labels},
		Spec:       *base.Spec.DeepCopy(),
	}
	// The chart's (templates/_sandboxtemplate.tpl): the agent image mounted as a volume
	// (images.agentVolume image), or copied from by install-agent.
	sources := 0
	for i, init := range tmpl.Spec.PodTemplate.Spec.InitContainers {
		if init.Name == "install-agent" {
			tmpl.Spec.PodTemplate.Spec.InitContainers[i].Image = ref
			sources++
		}
	}
	for i, v := range tmpl.Spec.PodTemplate.Spec.Volumes {
		if v.Name == "sandbox-executor-agent" && v.Image != nil {
			tmpl.Spec.PodTemplate.Spec.Volumes[i].Image.Reference = ref
			sources++
		}
	}
	if sources != 1 {
		b.Fatalf("SandboxTemplate %s takes the agent from %d places (install-agent, image volume), want 1", localcluster.Template, sources)
	}
	_ = templates.Delete(ctx, name, metav1.DeleteOptions{})
	if _, err := templates.Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = templates.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return name
}

// removeImage removes ref from the node's containerd, with the cluster's own ctr
// (tests/cluster/lib.sh: CLUSTER_BIN, CONTAINERD_SOCK).
func removeImage(b *testing.B, c *clusterjobs.Cluster, ref string) {
	ctr := exec.Command(filepath.Join(c.Dir, "bin", "ctr"), "--address", filepath.Join(c.Dir, "run", "containerd.sock"),
		"--namespace", "k8s.io", "images", "rm", ref)
	if out, err := ctr.CombinedOutput(); err != nil && !strings.Contains(string(out), "not found") {
		b.Errorf("removing image %s: %v\n%s", ref, err, out)
	}
}
