package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent"
	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
)

// imageStartupCode gives the container's environment what an image's ENV can: startup files for
// the shell that write marker when sourced. It returns the marker's path.
func imageStartupCode(t *testing.T) string {
	dir := t.TempDir()
	marker := filepath.Join(dir, "image-code-ran")
	rc := filepath.Join(dir, "rc")
	if err := os.WriteFile(rc, []byte("echo ran >> "+marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BASH_ENV", rc)
	t.Setenv("ENV", rc)
	return marker
}

// spares lists the spare shells the daemon of stages keeps.
func spares(t testing.TB, stages string) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join(filepath.Dir(stages), "spares", "spare-*"))
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func waitForSpare(t testing.TB, stages string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(spares(t, stages)) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no spare shell 10s after the pod was bound to its job")
		}
	}
}

// runStage runs script as a stage through the daemon of stages and returns its output.
func runStage(t testing.TB, stages, name, script string) string {
	t.Helper()
	a := agent.New(agent.Options{StagesDir: stages})
	code, stdout, stderr := run(a, script, startArgs(a, name, script, false)...)
	if _, status, ok, _ := controls(t, stderr); code != 0 || !ok || status != 0 {
		t.Fatalf("stage %s: exit %d, status %d (%t): %s", name, code, status, ok, stderr)
	}
	return stdout
}

// probeOverNetwork binds the baked agent's pod to job, as prepare's probe does.
func probeOverNetwork(t *testing.T, port int, ca *agentca.CA, job, identity string) {
	t.Helper()
	conn, err := tls.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), clientConfig(t, ca, job, identity))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, wire.RequestHeader([]string{"probe"}, 0)); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if code, err := wire.ReadFrames(bufio.NewReader(conn), &stdout, io.Discard); err != nil || code != 0 {
		t.Fatalf("probe: %d, %v", code, err)
	}
}

// A warm pod's agent starts no shell of the image until a job has the pod: the spare waits for
// the network path to admit the job. No stage shell, spare or not, sources the image's startup
// files (BASH_ENV, ENV).
func TestSpareShellWaitsForTheJobOnTheNetworkPath(t *testing.T) {
	marker := imageStartupCode(t)
	ca := fakecluster.AgentCA(t)
	baked := fakecluster.StartBakedAgent(t, ca)
	identity := baked.Identity(t)
	time.Sleep(300 * time.Millisecond) // what a spare started with the daemon needs to show
	if found := spares(t, baked.Stages); len(found) != 0 {
		t.Fatalf("a spare shell runs in a pod no job has: %v", found)
	}
	probeOverNetwork(t, baked.Port, ca, "job-a", identity)
	waitForSpare(t, baked.Stages)
	for _, stage := range []string{"first", "second"} { // the first takes the spare, the second a fresh one
		if out := runStage(t, baked.Stages, stage, "echo bash_env=${BASH_ENV-unset} env=${ENV-unset}\n"); out != "bash_env=unset env=unset\n" {
			t.Errorf("stage %s saw %q; want the startup variables unset", stage, out)
		}
	}
	if data, err := os.ReadFile(marker); err == nil {
		t.Errorf("the image's startup file ran %d times", strings.Count(string(data), "ran"))
	}
}

// Without the network path, the pod is the job's once its first stage arrives over exec: that
// stage starts on demand, and the next one gets a spare.
func TestSpareShellWaitsForTheFirstStageOverExec(t *testing.T) {
	baked := fakecluster.StartBakedAgent(t, nil)
	line, err := baked.FirstLogLine(context.Background(), nil, 10*time.Second)
	if _, off, ok := wire.ParseFirstLogLine(line); err != nil || !ok || off == "" {
		t.Fatalf("the agent serves a network path without the agent CA")
	}
	time.Sleep(300 * time.Millisecond)
	if found := spares(t, baked.Stages); len(found) != 0 {
		t.Fatalf("a spare shell runs in a pod no job has: %v", found)
	}
	runStage(t, baked.Stages, "first", "true\n")
	waitForSpare(t, baked.Stages)
}

// init runs at prepare, in a pod already the job's: its daemon keeps a spare from the start.
func TestInitKeepsASpareAtOnce(t *testing.T) {
	local := fakecluster.NewLocalWithDaemon(t)
	waitForSpare(t, local.Agent.StagesDir())
}

// BenchmarkFirstStage is what waiting for the job costs the first stage: a daemon of a warm pod
// used to have a spare ready for it; now the first stage over exec starts its shell on demand
// (over the network path, prepare's probe binds the pod and the spare is usually ready by the
// first stage). Compare on-demand with spare-ready.
func BenchmarkFirstStage(b *testing.B) {
	const script = "true\n"
	b.Run("on-demand", func(b *testing.B) {
		for i := range b.N {
			b.StopTimer()
			baked := fakecluster.StartBakedAgent(b, nil)
			if _, err := baked.FirstLogLine(context.Background(), nil, 10*time.Second); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			runStage(b, baked.Stages, "s"+strconv.Itoa(i), script)
		}
	})
	b.Run("spare-ready", func(b *testing.B) {
		baked := fakecluster.StartBakedAgent(b, nil)
		if _, err := baked.FirstLogLine(context.Background(), nil, 10*time.Second); err != nil {
			b.Fatal(err)
		}
		runStage(b, baked.Stages, "bind", script)
		for i := range b.N {
			b.StopTimer()
			waitForSpare(b, baked.Stages)
			b.StartTimer()
			runStage(b, baked.Stages, "s"+strconv.Itoa(i), script)
		}
	})
}
