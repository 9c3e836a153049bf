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

	"github.com/sandbox-executor/sandbox-executor/tests/clustertest"
	"github.com/sandbox-executor/sandbox-executor/tests/faultproxy"
	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
)

// withProxy is the suite's executor configuration with the API server behind a fault-injecting
// proxy, and stages pinned to the exec transport.
func withProxy(t *testing.T) (*clustertest.Runner, *faultproxy.Proxy) {
	t.Helper()
	c := clustertest.Connect(t)
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
	return newRunner(t, c, localcluster.Config{Kubeconfig: path, Extra: execThroughAPIServer}), proxy
}

// execThroughAPIServer pins stages to the exec transport: these faults are on the path through
// the API server, which the network transport does not take.
const execThroughAPIServer = "reconnects = 20\nstage_transport = \"exec\""

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
			c, proxy := withProxy(t)
			j, _, _ := preparedJob(t, c, ciImage)
			script, want := numbered(3000, 500, tc.exit)
			run := j.Command("run", j.Script(t, script), "build_script")
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
			if code := clustertest.ExitCode(err); code != tc.wantCode {
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
	j, pod, _ := preparedJob(t, c, ciImage)
	run := j.Command("run", j.Script(t, "echo stage-started\nsleep 120\n"), "build_script")
	live := clustertest.NewLive()
	run.Stdout, run.Stderr = live, live
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	live.Wait("stage-started", 60*time.Second)
	if err := c.Admin.Kube.CoreV1().Pods(namespace).Delete(context.Background(), pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := run.Wait()
	if code := clustertest.ExitCode(err); code != 2 {
		t.Errorf("exit %d after the pod was deleted, want SYSTEM_FAILURE (2)", code)
	}
	mustContain(t, "job log", live.String(), "pod "+namespace+"/"+pod)
	if !strings.Contains(live.String(), "deleted") && !strings.Contains(live.String(), "replaced") {
		t.Errorf("the failure does not say the pod was deleted:\n%s", live.String())
	}
}

// TestSteadyOutputForAMinute: 1 MB/s for 60 s arrives complete.
func TestSteadyOutputForAMinute(t *testing.T) {
	c := newCluster(t)
	j, _, _ := preparedJob(t, c, ciImage)
	script := "i=0\nwhile [ $i -lt 60 ]; do head -c 1048576 /dev/zero | tr '\\0' x; echo; sleep 1; i=$((i+1)); done\n"
	var stdout bytes.Buffer
	run := j.Command("run", j.Script(t, script), "build_script")
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
	c := newCluster(t, execThroughAPIServer)
	j, _, _ := preparedJob(t, c, ciImage)
	script, want := numbered(1500, 300, 0)
	run := j.Command("run", j.Script(t, script), "build_script")
	var stdout bytes.Buffer
	live := clustertest.NewLive()
	run.Stdout, run.Stderr = io.MultiWriter(&stdout, live), live
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	live.Wait("line 00100", 60*time.Second)
	restart := exec.Command(filepath.Join(repoRoot(t), "tests", "cluster", "start.sh"), "stop", "apiserver")
	if out, err := restart.CombinedOutput(); err != nil {
		t.Fatalf("stopping kube-apiserver: %v\n%s", err, out)
	}
	time.Sleep(2 * time.Second) // the stage keeps running in the pod meanwhile
	if out, err := exec.Command(filepath.Join(repoRoot(t), "tests", "cluster", "start.sh"), "start", "apiserver").CombinedOutput(); err != nil {
		t.Fatalf("starting kube-apiserver: %v\n%s", err, out)
	}
	if err := run.Wait(); err != nil {
		t.Fatalf("run after an API server restart: %v\n%s", err, live.String())
	}
	if stdout.String() != want {
		t.Fatalf("output differs after the restart: got %d bytes, want %d\n%s", stdout.Len(), len(want), live.String())
	}
	if !strings.Contains(live.String(), "re-attaching") {
		t.Errorf("no reconnect noted: the restart did not hit the stage")
	}
	if strings.Contains(live.String(), "UnhandledError") {
		t.Errorf("client-go's own log lines reached the job log:\n%s", live.String())
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
