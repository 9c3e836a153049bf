//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/faultproxy"
)

// withProxy points the executor at the API server through a fault-injecting proxy.
func withProxy(t *testing.T, c *cluster) *faultproxy.Proxy {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(c.ExecutorKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	var proxy *faultproxy.Proxy
	for _, cl := range kc.Clusters {
		u, err := url.Parse(cl.Server)
		if err != nil {
			t.Fatal(err)
		}
		if proxy, err = faultproxy.Start(u.Host); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proxy.Close)
		cl.TLSServerName = u.Hostname() // the API server's certificate names it, not the proxy
		cl.Server = "https://" + proxy.Addr()
	}
	path := filepath.Join(t.TempDir(), "proxied.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteConfig(c.configPath, c.runnerName, execThroughAPIServer); err != nil {
		t.Fatal(err)
	}
	// WriteConfig uses the cluster's kubeconfig: swap in the proxied one.
	replaceInFile(t, c.configPath, c.ExecutorKubeconfig(), path)
	return proxy
}

// execThroughAPIServer pins stages to the exec transport: these faults are on the path through
// the API server, which the network transport does not take.
const execThroughAPIServer = "reconnects = 20\nstage_transport = \"exec\""

// preparedJob runs prepare for a new job on image and registers its cleanup, which must leave
// nothing behind. It returns the stage environment, the pod and prepare's job log.
func preparedJob(t testing.TB, c *cluster, image string) (*stageEnv, string, string) {
	t.Helper()
	jobID := fakegitlab.NextJobID()
	env := newStageEnv(t, jobID, image)
	prep, err := c.stage(env, "prepare").CombinedOutput()
	if err != nil {
		t.Fatalf("prepare: %v\n%s", err, prep)
	}
	t.Cleanup(func() {
		if out, err := c.stage(env, "cleanup").CombinedOutput(); err != nil {
			t.Errorf("cleanup: %v\n%s", err, out)
		}
		c.assertJobGone(t, jobID)
	})
	return env, podFromPrepareLog(t, string(prep)), string(prep)
}

// numbered is a stage that prints lines with pauses, so that cuts land mid-output; want is
// its exact output.
func numbered(lines, pauseEvery int, exit int) (script, want string) {
	var w strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&w, "line %05d of a stage that must arrive exactly once\n", i)
	}
	script = fmt.Sprintf("i=1\nwhile [ $i -le %d ]; do\n  printf 'line %%05d of a stage that must arrive exactly once\\n' $i\n  [ $((i %% %d)) -eq 0 ] && sleep 1\n  i=$((i+1))\ndone\nexit %d\n", lines, pauseEvery, exit)
	return script, w.String()
}

// TestStageSurvivesStreamCuts cuts every connection between the executor and the API server
// several times during one stage: the job log must get the complete output exactly once, and
// the right exit code.
func TestStageSurvivesStreamCuts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		exit     int
		wantCode int
	}{{"passing", 0, 0}, {"failing", 5, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			proxy := withProxy(t, c)
			env, _, _ := preparedJob(t, c, ciImage)
			script, want := numbered(3000, 500, tc.exit)
			run := c.stage(env, "run", env.script(t, "numbered.sh", script), "build_script")
			var stdout, stderr bytes.Buffer
			run.Stdout, run.Stderr = &stdout, &stderr
			if err := run.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- run.Wait() }()
			cuts := 0
			var err error
		loop:
			for {
				select {
				case err = <-done:
					break loop
				case <-time.After(1500 * time.Millisecond):
					proxy.Cut()
					cuts++
				}
			}
			if cuts < 3 {
				t.Errorf("only %d cuts happened during the stage; want several", cuts)
			}
			if code := exitCode(err); code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.wantCode, stderr.String())
			}
			if stdout.String() != want {
				t.Fatalf("output after %d cuts differs: got %d bytes, want %d (lost or duplicated output)\nstderr:\n%s", cuts, stdout.Len(), len(want), stderr.String())
			}
			if !strings.Contains(stderr.String(), "re-attaching") {
				t.Errorf("the job log does not note the reconnects:\n%s", stderr.String())
			}
			t.Logf("%d cuts, %d reconnects noted", cuts, strings.Count(stderr.String(), "re-attaching"))
		})
	}
}

// TestPodDeletedMidStage: a pod deleted under a running stage is a system failure naming it.
func TestPodDeletedMidStage(t *testing.T) {
	c := newCluster(t)
	env, pod, _ := preparedJob(t, c, ciImage)
	run := c.stage(env, "run", env.script(t, "long.sh", "echo stage-started\nsleep 120\n"), "build_script")
	live := &arrivals{markers: map[string]time.Time{"stage-started": {}}}
	run.Stdout, run.Stderr = live, live
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); live.at("stage-started").IsZero() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.admin.Kube.CoreV1().Pods(namespace).Delete(context.Background(), pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := run.Wait()
	if code := exitCode(err); code != 2 {
		t.Errorf("exit %d after the pod was deleted, want SYSTEM_FAILURE (2)", code)
	}
	mustContain(t, "job log", live.text.String(), "pod "+namespace+"/"+pod)
	if !strings.Contains(live.text.String(), "deleted") && !strings.Contains(live.text.String(), "replaced") {
		t.Errorf("the failure does not say the pod was deleted:\n%s", live.text.String())
	}
}

// TestSteadyOutputForAMinute: 1 MB/s for 60 s arrives complete.
func TestSteadyOutputForAMinute(t *testing.T) {
	c := newCluster(t)
	env, _, _ := preparedJob(t, c, ciImage)
	script := "i=0\nwhile [ $i -lt 60 ]; do head -c 1048576 /dev/zero | tr '\\0' x; echo; sleep 1; i=$((i+1)); done\n"
	var stdout bytes.Buffer
	run := c.stage(env, "run", env.script(t, "steady.sh", script), "build_script")
	run.Stdout = &stdout
	start := time.Now()
	if err := run.Run(); err != nil {
		t.Fatal(err)
	}
	if want := 60 * (1<<20 + 1); stdout.Len() != want || strings.Count(stdout.String(), "\n") != 60 {
		t.Errorf("got %d bytes, want %d", stdout.Len(), want)
	}
	t.Logf("60 MiB at ~1 MiB/s in %s", time.Since(start).Round(time.Second))
}

// TestStageSurvivesAPIServerRestart restarts kube-apiserver in the middle of a stage: the stage
// goes on in the pod, and run re-attaches once the API server is back.
func TestStageSurvivesAPIServerRestart(t *testing.T) {
	c := newCluster(t)
	if err := c.WriteConfig(c.configPath, c.runnerName, execThroughAPIServer); err != nil {
		t.Fatal(err)
	}
	env, _, _ := preparedJob(t, c, ciImage)
	script, want := numbered(1500, 300, 0)
	run := c.stage(env, "run", env.script(t, "numbered.sh", script), "build_script")
	var stdout bytes.Buffer
	live := &arrivals{markers: map[string]time.Time{"line 00100": {}}}
	run.Stdout, run.Stderr = io.MultiWriter(&stdout, live), live
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); live.at("line 00100").IsZero() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	restart := exec.Command(filepath.Join(repoRoot(t), "tests", "cluster", "start.sh"), "stop", "apiserver")
	if out, err := restart.CombinedOutput(); err != nil {
		t.Fatalf("stopping kube-apiserver: %v\n%s", err, out)
	}
	time.Sleep(2 * time.Second) // the stage keeps running in the pod meanwhile
	if out, err := exec.Command(filepath.Join(repoRoot(t), "tests", "cluster", "start.sh"), "start", "apiserver").CombinedOutput(); err != nil {
		t.Fatalf("starting kube-apiserver: %v\n%s", err, out)
	}
	if err := run.Wait(); err != nil {
		t.Fatalf("run after an API server restart: %v\n%s", err, live.text.String())
	}
	if stdout.String() != want {
		t.Fatalf("output differs after the restart: got %d bytes, want %d\n%s", stdout.Len(), len(want), live.text.String())
	}
	if !strings.Contains(live.text.String(), "re-attaching") {
		t.Errorf("no reconnect noted: the restart did not hit the stage")
	}
	if strings.Contains(live.text.String(), "UnhandledError") {
		t.Errorf("client-go's own log lines reached the job log:\n%s", live.text.String())
	}
}

func repoRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
