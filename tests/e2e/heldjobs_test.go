//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// heldJob is a job of a chart install that prints its marker, waits until the test opens its
// gate (a file in its pod), then prints lines numbered lines: a job surely running while the
// test disrupts something (a drain, an upgrade), whose whole output the test then checks.
type heldJob struct {
	Job   fakegitlab.Job
	lines int
	// Pod is its claim's pod, as it was once the job printed its marker.
	Pod *corev1.Pod
}

// heldJobGate is the file a held job waits for in its pod.
const heldJobGate = "/tmp/held-job-gate"

// heldJobMarker is what a held job prints before it waits.
const heldJobMarker = "held job waiting for its gate"

// heldJobLine is line i of job id's output.
func heldJobLine(id int64, i int) string { return fmt.Sprintf("held job %d line %d\n", id, i) }

// startHeldJobs enqueues n held jobs in image with the instance of release r, and returns them
// once each has printed its marker, with its pod.
func startHeldJobs(t *testing.T, c *clusterjobs.Cluster, inst *duoflow.Instance, r *chartinstall.Release, image string, n, lines int) []*heldJob {
	t.Helper()
	jobs := make([]*heldJob, n)
	for i := range jobs {
		job := inst.GitLab.NewJob(fakegitlab.JobSpec{Image: image, GitStrategy: "none", Script: []string{
			"echo " + heldJobMarker,
			"while [ ! -e " + heldJobGate + " ]; do sleep 0.2; done",
			fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "held job $CI_JOB_ID line $i"; i=$((i+1)); done`, lines),
		}})
		inst.GitLab.Enqueue(job)
		jobs[i] = &heldJob{Job: job, lines: lines}
	}
	ctx := context.Background()
	for _, h := range jobs {
		started, cancel := context.WithTimeout(ctx, inClusterTimeout)
		res, err := inst.GitLab.WaitForTrace(started, h.Job.ID, heldJobMarker)
		cancel()
		if err != nil {
			t.Fatalf("job %d never started its stage: %v\n%s\nrunner pod log:\n%s", h.Job.ID, err, res.Trace, r.RunnerLog())
		}
		claims, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJobID + "=" + strconv.FormatInt(h.Job.ID, 10)})
		if err != nil || len(claims.Items) != 1 {
			t.Fatalf("job %d: its claim in %s: %v (%d found)", h.Job.ID, r.Namespace, err, len(claims.Items))
		}
		pod := podOfClaim(t, c, &claims.Items[0])
		if h.Pod, err = c.Admin.Kube.CoreV1().Pods(r.Namespace).Get(ctx, pod, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return jobs
}

// open lets the job go on: it creates the gate in its pod.
func (h *heldJob) open(t *testing.T, r *chartinstall.Release) {
	t.Helper()
	if _, err := r.Kubectl("-n", h.Pod.Namespace, "exec", h.Pod.Name, "-c", "job", "--", "touch", heldJobGate); err != nil {
		t.Fatalf("opening the gate of job %d: %v", h.Job.ID, err)
	}
}

// assertWhole waits for the job to end, and fails the test unless it succeeded with each of its
// numbered lines exactly once; what is the disruption it ran through, for the messages.
func (h *heldJob) assertWhole(t *testing.T, what string, wait func(int64) fakegitlab.Result) fakegitlab.Result {
	t.Helper()
	res := wait(h.Job.ID)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("job %d %s: %s (%s)\n%s", h.Job.ID, what, res.State, res.FailureReason, res.Trace)
	}
	for i := 1; i <= h.lines; i++ {
		if n := strings.Count(res.Trace, heldJobLine(h.Job.ID, i)); n != 1 {
			t.Fatalf("job %d %s: line %d arrived %d times, want once\n%s", h.Job.ID, what, i, n, res.Trace)
		}
	}
	return res
}
