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
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/faultproxy"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// withProxy is the suite's executor configuration with the API server behind a fault-injecting
// proxy, and stages pinned to the exec transport, on path (served: the stage server's
// connection goes through the proxy too).
func withProxy(t *testing.T, runPath runPath) (*clusterjobs.Runner, *faultproxy.Proxy) {
	t.Helper()
	c := clusterjobs.Connect(t)
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
	return newRunnerOn(t, c, localcluster.Config{Kubeconfig: path, Extra: execThroughAPIServer}, runPath), proxy
}

// execThroughAPIServer pins stages to the exec transport: these faults are on the path through
// the API server, which the network transport does not take.
const execThroughAPIServer = "reconnects = 20\nstage_transport = \"exec\""

// numbered is a stage that prints lines with pauses, so that cuts land mid-output; want is
// its exact output.
func numbered(lines, pauseEvery int, exit int) (script, want string) {
	return numberedFrom(1, lines, pauseEvery, exit)
}

// numberedFrom is numbered starting at line first and ending at line last.
func numberedFrom(first, last, pauseEvery int, exit int) (script, want string) {
	var w strings.Builder
	for i := first; i <= last; i++ {
		fmt.Fprintf(&w, "line %05d of a stage that must arrive exactly once\n", i)
	}
	script = fmt.Sprintf("i=%d\nwhile [ $i -le %d ]; do\n  printf 'line %%05d of a stage that must arrive exactly once\\n' $i\n  [ $((i %% %d)) -eq 0 ] && sleep 1\n  i=$((i+1))\ndone\nexit %d\n", first, last, pauseEvery, exit)
	return script, w.String()
}

// TestStageSurvivesStreamCuts cuts every connection between the executor and the API server
// three times during one stage, each time while the stage is held mid-output: the job log must
// get the complete output exactly once, and the right exit code. On both run paths.
func TestStageSurvivesStreamCuts(t *testing.T) {
	t.Parallel()
	onEachRunPath(t, func(t *testing.T, path runPath) {
		for _, tc := range []struct {
			name     string
			exit     int
			wantCode int
		}{{"passing", 0, 0}, {"failing", 5, 1}} {
			t.Run(tc.name, func(t *testing.T) {
				c, proxy := withProxy(t, path)
				j, pod, _ := preparedJob(t, c, ciImage)
				stage := gatedStage{last: 3000, gates: []int{500, 1500, 2500}, exit: tc.exit}
				out := stage.runThroughBreaks(t, c, j, pod, func() { proxy.Cut() }, func() {})
				if code := clusterjobs.ExitCode(out.err); code != tc.wantCode {
					t.Fatalf("exit %d, want %d; job log:\n%s", code, tc.wantCode, out.log)
				}
			})
		}
	})
}

// TestPodDeletedMidStage: a pod deleted under a running stage is a system failure naming it. On
// both run paths.
func TestPodDeletedMidStage(t *testing.T) {
	t.Parallel()
	onEachRunPath(t, testPodDeletedMidStage)
}

func testPodDeletedMidStage(t *testing.T, path runPath) {
	c := newClusterOn(t, path)
	j, pod, _ := preparedJob(t, c, ciImage)
	run := j.Command("run", j.Script(t, "echo stage-started\nsleep 120\n"), "build_script")
	live := clusterjobs.NewLive()
	run.Stdout, run.Stderr = live, live
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	live.Wait("stage-started", 60*time.Second)
	if err := c.Admin.Kube.CoreV1().Pods(namespace).Delete(context.Background(), pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := run.Wait()
	if code := clusterjobs.ExitCode(err); code != 2 {
		t.Errorf("exit %d after the pod was deleted, want SYSTEM_FAILURE (2)", code)
	}
	mustContain(t, "job log", live.String(), "pod "+namespace+"/"+pod)
	if !strings.Contains(live.String(), "deleted") && !strings.Contains(live.String(), "replaced") {
		t.Errorf("the failure does not say the pod was deleted:\n%s", live.String())
	}
}

// TestSteadyOutputForAMinute: 1 MB/s for 60 s arrives complete. On both run paths.
func TestSteadyOutputForAMinute(t *testing.T) {
	t.Parallel()
	onEachRunPath(t, testSteadyOutputForAMinute)
}

func testSteadyOutputForAMinute(t *testing.T, path runPath) {
	c := newClusterOn(t, path)
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

// TestStageSurvivesAPIServerCrash kills kube-apiserver (SIGKILL, as a crash or an OOM kill would)
// while a stage is held mid-output. The kill drops the exec stream at once (the kernel closes
// the dead server's sockets); run must note the drop, re-attach once the API server is back, and
// deliver the exact output. Before it returns, the cluster is whole again, NetworkPolicy
// enforcement included. On both run paths at once, through the same crash (served: the stage
// server's warm connection to the API server is the one that breaks): each crash, and the wait
// until the cluster is whole again, holds up every other test for about a minute.
func TestStageSurvivesAPIServerCrash(t *testing.T) {
	// Serial: it kills kube-apiserver, which every other test needs.
	var stages []stageUnderBreaks
	for _, path := range runPaths {
		c := newClusterOn(t, path, execThroughAPIServer)
		j, pod, _ := preparedJob(t, c, ciImage)
		stages = append(stages, stageUnderBreaks{name: path.name, c: c, j: j, pod: pod})
	}
	clusterjobs.RestoreAfterBreak(t, func() error { return clusterjobs.RunScript("start.sh", "start", "apiserver") })
	stage := gatedStage{last: 400, gates: []int{100}}
	outcomes := stage.runAllThroughBreaks(t, stages,
		func() {
			if err := clusterjobs.RunScript("start.sh", "kill", "apiserver"); err != nil {
				t.Fatal(err)
			}
		},
		func() {
			if err := clusterjobs.RunScript("start.sh", "start", "apiserver"); err != nil {
				t.Fatal(err)
			}
		})
	for i, out := range outcomes {
		if out.err != nil {
			t.Errorf("%s: run after an API server crash: %v\n%s", stages[i].name, out.err, out.log)
		}
		if strings.Contains(out.log, "UnhandledError") {
			t.Errorf("%s: client-go's own log lines reached the job log:\n%s", stages[i].name, out.log)
		}
	}
}

// TestNetworkTransportSurvivesResetAndSilentDrop breaks the default transport's stream between
// run (on the runner's host) and the agent in the pod, each time while the stage is held at a
// gate: first a TCP reset (ss -K aborts the connection, as a conntrack flush or a middlebox's RST
// would), then a silent drop (iptables DROP both ways: a dead path that sends nothing) that
// outlasts the stream's silence limit. run must note each drop, re-attach once the path is back,
// and deliver the exact output. On both run paths (served: the connection is the stage server's).
func TestNetworkTransportSurvivesResetAndSilentDrop(t *testing.T) {
	t.Parallel()
	onEachRunPath(t, testNetworkTransportSurvivesResetAndSilentDrop)
}

func testNetworkTransportSurvivesResetAndSilentDrop(t *testing.T, path runPath) {
	c := newClusterOn(t, path, `stage_transport = "network"`)
	j, pod, prep := preparedJob(t, c, ciImage)
	mustContain(t, "prepare log", prep, "stages over pod network")
	ip := j.PodObject(t).Status.PodIP
	port := strconv.Itoa(wire.NetworkPort)
	// In the raw table, which comes before the filter table, where the policy controller accepts
	// established connections ahead of any rule a test could insert.
	drop := [][]string{
		{"PREROUTING", "-t", "raw", "-s", ip, "-p", "tcp", "--sport", port, "-j", "DROP"},
		{"OUTPUT", "-t", "raw", "-d", ip, "-p", "tcp", "--dport", port, "-j", "DROP"},
	}
	undrop := func() {
		for _, rule := range drop {
			for exec.Command("iptables", append([]string{"-w", "5", "-D"}, rule...)...).Run() == nil {
			}
		}
	}
	t.Cleanup(undrop)
	breaks := []func(){
		func() {
			if out, err := exec.Command("ss", "-K", "dst", ip, "dport", "=", port).CombinedOutput(); err != nil {
				t.Fatalf("ss -K: %v %s", err, out)
			}
		},
		func() {
			for _, rule := range drop {
				if out, err := exec.Command("iptables", append([]string{"-w", "5", "-I"}, rule...)...).CombinedOutput(); err != nil {
					t.Fatalf("iptables -I %v: %v %s", rule, err, out)
				}
			}
		},
	}
	n := 0
	stage := gatedStage{last: 300, gates: []int{100, 200}}
	out := stage.runThroughBreaks(t, c, j, pod,
		func() { breaks[n]() },
		func() { undrop(); n++ })
	if out.err != nil {
		t.Fatalf("run after a reset and a silent drop: %v\n%s", out.err, out.log)
	}
}

// gatedStage prints numbered lines 1..last and exits with exit. After each line in gates it
// waits until a gate file exists in the pod, so a test knows the stage is mid-output when it
// breaks something, and the stage cannot end before the break is noticed.
type gatedStage struct {
	last  int
	gates []int
	exit  int
}

const gatePrefix = "/tmp/stage-gate-"

func gateFile(line int) string { return gatePrefix + strconv.Itoa(line) }

func (g gatedStage) script() (script, want string) {
	var w, gates strings.Builder
	for i := 1; i <= g.last; i++ {
		fmt.Fprintf(&w, "line %05d of a stage that must arrive exactly once\n", i)
	}
	for _, line := range g.gates {
		fmt.Fprintf(&gates, " %d", line)
	}
	script = fmt.Sprintf(`i=1
while [ $i -le %d ]; do
  printf 'line %%05d of a stage that must arrive exactly once\n' $i
  case " %s " in *" $i "*) while [ ! -e %s ]; do sleep 0.1; done ;; esac
  i=$((i+1))
done
exit %d
`, g.last, gates.String(), gatePrefix+"$i", g.exit)
	return script, w.String()
}

// stageOutcome is how run ended and what it wrote.
type stageOutcome struct {
	err error
	// log is the job log: the stage's output and run's own lines.
	log string
}

// runThroughBreaks runs the stage. At each gate it calls breakStream, waits until run notes one
// more dropped stream, calls mend, and opens the gate (with admin rights, past any proxy). It
// fails the test unless the stage's output arrived exactly once and every break was noted.
func (g gatedStage) runThroughBreaks(t *testing.T, c *clusterjobs.Runner, j *clusterjobs.Job, pod string, breakStream, mend func()) stageOutcome {
	t.Helper()
	return g.runAllThroughBreaks(t, []stageUnderBreaks{{c: c, j: j, pod: pod}}, breakStream, mend)[0]
}

// stageUnderBreaks is one job's stage for runAllThroughBreaks: its runner, job and pod, and a
// name for the messages (none when it is alone).
type stageUnderBreaks struct {
	name string
	c    *clusterjobs.Runner
	j    *clusterjobs.Job
	pod  string
}

func (s stageUnderBreaks) prefix() string {
	if s.name == "" {
		return ""
	}
	return s.name + ": "
}

// runAllThroughBreaks is runThroughBreaks for several jobs' stages at once, through the same
// breaks: at each gate, every stage is held there when breakStream runs, and every run must
// note the break before mend. One break for all, where a break is costly (the API server's).
func (g gatedStage) runAllThroughBreaks(t *testing.T, stages []stageUnderBreaks, breakStream, mend func()) []stageOutcome {
	t.Helper()
	script, want := g.script()
	runs := make([]*exec.Cmd, len(stages))
	stdouts := make([]*bytes.Buffer, len(stages))
	lives := make([]*clusterjobs.Live, len(stages))
	for i, s := range stages {
		runs[i] = s.j.Command("run", s.j.Script(t, script), "build_script")
		stdouts[i], lives[i] = &bytes.Buffer{}, clusterjobs.NewLive()
		runs[i].Stdout, runs[i].Stderr = io.MultiWriter(stdouts[i], lives[i]), lives[i]
		if err := runs[i].Start(); err != nil {
			t.Fatal(err)
		}
		defer runs[i].Process.Kill() // a no-op once run has exited
	}
	for n, line := range g.gates {
		for i, s := range stages {
			if !lives[i].Wait(fmt.Sprintf("line %05d", line), 2*time.Minute) {
				t.Fatalf("%sthe stage did not reach its gate at line %d:\n%s", s.prefix(), line, lives[i].String())
			}
		}
		breakStream()
		for i, s := range stages {
			if !lives[i].WaitCount("re-attaching", n+1, 2*time.Minute) {
				t.Fatalf("%srun did not notice break %d (at line %d):\n%s", s.prefix(), n+1, line, lives[i].String())
			}
		}
		mend()
		for _, s := range stages {
			if out, err := s.c.Exec(context.Background(), s.pod, "touch", gateFile(line)); err != nil {
				t.Fatalf("%sopening the gate at line %d in pod %s: %v %s", s.prefix(), line, s.pod, err, out)
			}
		}
	}
	outcomes := make([]stageOutcome, len(stages))
	for i, s := range stages {
		err := runs[i].Wait()
		if stdouts[i].String() != want {
			t.Fatalf("%soutput after %d breaks differs: got %d bytes, want %d (lost or duplicated output)\n%s",
				s.prefix(), len(g.gates), stdouts[i].Len(), len(want), lives[i].String())
		}
		t.Logf("%s%d breaks, %d re-attaches noted", s.prefix(), len(g.gates), strings.Count(lives[i].String(), "re-attaching"))
		outcomes[i] = stageOutcome{err: err, log: lives[i].String()}
	}
	return outcomes
}
