//go:build security

package security

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

// kubeletHealthz is the kubelet's own health endpoint (tests/cluster/lib.sh).
const kubeletHealthz = "http://127.0.0.1:10248/healthz"

// Bombs bounded to twice or more what the limits allow, so that a missing limit fails the test
// ("bomb-complete") instead of taking the shared machine down.
var bombs = []struct {
	name, limit string
	// cause is what the kubelet records on the pod when the limit ends the job; a fork bomb
	// leaves only a container that exited with an error (gVisor cannot start its host tasks).
	cause, script string
}{
	// Each guest process costs ~2 host tasks under gVisor: 3000 processes are ~6000 tasks,
	// beyond the kubelet's podPidsLimit (1024; tests/cluster/configs.sh).
	{"fork", "podPidsLimit", "Error", `n=0
while [ $n -lt 3000 ]; do sleep 120 & n=$((n+1)); done
echo "bomb-complete: $n processes"
`},
	// 3000 MB held by one process against the template's 2Gi memory limit, in one string: gVisor
	// fills it in ~13 s on the local node (a pipe into tail took ~100 s of both its CPUs).
	{"memory", "limits.memory", "OOMKilled", `perl -e '$x = "x" x (3000 << 20)'
echo "bomb-complete: 3000 MB held"
`},
	// 6 GiB on the root filesystem (gVisor's overlay keeps it in a file on the node's disk)
	// against the template's 4Gi ephemeral-storage limit. fallocate takes real blocks of the
	// node's disk, as writing would, without the I/O; the kubelet's eviction checks every 10 s.
	{"disk", "limits.ephemeral-storage", "Evicted", `i=0
while [ $i -lt 6 ]; do i=$((i+1)); fallocate -l 1G /fill$i || break; done
df -h /
sleep 120
echo "bomb-complete: $i GiB kept for 2 minutes"
`},
}

// TestResourceBombsEndOnlyTheirJob: a fork bomb, a memory bomb and a disk fill each end their
// own job: its run stage returns (no hang) with a failure exit code; the node stays Ready, a job
// that was running next to them is untouched, and a fresh job right after them succeeds.
func TestResourceBombsEndOnlyTheirJob(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	r := c.NewRunner(t, "sec-bombs", "")
	bystander := prepared(t, r, clusterjobs.JobSpec{})
	bystander.MustRun(t, "echo before > /tmp/bystander\n")

	t.Run("bombs", func(t *testing.T) {
		for _, b := range bombs {
			t.Run(b.name, func(t *testing.T) {
				t.Parallel()
				j := prepared(t, r, clusterjobs.JobSpec{})
				terminations := watchTerminations(t, c, j)
				start := time.Now()
				res := j.Run(t, b.script)
				t.Logf("%s bomb: run exited %d after %s; last line: %s", b.name, res.ExitCode, time.Since(start).Round(time.Second), lastLine(res.Stderr))
				if strings.Contains(res.Stdout, "bomb-complete") {
					t.Errorf("the %s bomb ran to completion: %s does not hold:\n%s", b.name, b.limit, lastLine(res.Stdout))
				}
				if res.ExitCode != clusterjobs.BuildFailure && res.ExitCode != clusterjobs.SystemFailure {
					t.Errorf("run exited %d after the %s bomb, want a failure exit code\n%s", res.ExitCode, b.name, res.Output())
				}
				// What ended the job: the kubelet killed or evicted its pod for that limit.
				end := podEnd(t, c, j) + "; terminations seen: " + strings.Join(terminations(), ", ")
				if !strings.Contains(end, b.cause) {
					t.Errorf("the %s bomb's pod does not show %s: %s", b.name, b.cause, end)
				}
				t.Logf("%s bomb: %s", b.name, end)
			})
		}
	})

	nodeReady(t, c)
	if out := bystander.MustRun(t, "cat /tmp/bystander\n").Stdout; out != "before\n" {
		t.Errorf("the job running next to the bombs lost its state: %q", out)
	}
	next := prepared(t, r, clusterjobs.JobSpec{})
	if out := next.MustRun(t, "echo next-job-ok\n").Stdout; out != "next-job-ok\n" {
		t.Errorf("the job after the bombs printed %q", out)
	}
}

// nodeReady asserts that the kubelet is healthy and the node Ready.
func nodeReady(t *testing.T, c *clusterjobs.Cluster) {
	t.Helper()
	resp, err := http.Get(kubeletHealthz)
	if err != nil {
		t.Fatalf("the kubelet does not answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("kubelet healthz: %s", resp.Status)
	}
	nodes, err := c.Admin.Kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status != corev1.ConditionTrue {
				t.Errorf("node %s is not Ready: %s", n.Name, cond.Message)
			}
		}
	}
}

// podEnd says how the job's pod ended: its phase, its container's last termination and the
// Warning events about it.
func podEnd(t *testing.T, c *clusterjobs.Cluster, j *clusterjobs.Job) string {
	t.Helper()
	pod := j.PodObject(t)
	end := fmt.Sprintf("pod %s %s", pod.Name, pod.Status.Phase)
	if pod.Status.Reason != "" {
		end += " (" + pod.Status.Reason + ")"
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if term := cs.LastTerminationState.Terminated; term != nil {
			end += "; container restarted after " + term.Reason
		}
		if term := cs.State.Terminated; term != nil {
			end += "; container terminated: " + term.Reason
		}
	}
	events, err := c.Admin.Kube.CoreV1().Events(clusterjobs.Namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + pod.Name + ",type=Warning"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if string(e.InvolvedObject.UID) == j.PodUID && e.Reason != "MissingClusterDNS" && e.Reason != "FailedScheduling" {
			end += "; event " + e.Reason + ": " + e.Message
		}
	}
	return end
}

// watchTerminations watches j's pod from now until the test ends and returns what says every
// container termination its status showed, in order. The pod's status keeps only a container's
// last termination: when a memory bomb's OOM kill takes the whole sandbox down, the kubelet's
// restart of the container fails (StartError) and replaces the OOMKilled the bomb caused.
func watchTerminations(t *testing.T, c *clusterjobs.Cluster, j *clusterjobs.Job) func() []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.Admin.Kube.CoreV1().Pods(clusterjobs.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + j.Pod})
	if err != nil {
		cancel()
		t.Fatalf("watching pod %s: %v", j.Pod, err)
	}
	var mu sync.Mutex
	var seen []string
	known := map[string]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || string(pod.UID) != j.PodUID {
				continue
			}
			mu.Lock()
			for _, cs := range pod.Status.ContainerStatuses {
				for _, term := range []*corev1.ContainerStateTerminated{cs.LastTerminationState.Terminated, cs.State.Terminated} {
					if term == nil {
						continue
					}
					key := fmt.Sprintf("%s %s %s", cs.Name, term.ContainerID, term.Reason)
					if !known[key] {
						known[key] = true
						seen = append(seen, cs.Name+" "+term.Reason)
					}
				}
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-done
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
