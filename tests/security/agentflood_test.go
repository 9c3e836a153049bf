//go:build security

package security

import (
	"bytes"
	"context"
	"strings"
	"syscall"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

// floodPeakBound is what the runner-side run process may peak at (its maximum resident set)
// while a job floods it: the runner pod's 512 Mi is shared by gitlab-runner, the stage server
// and 8 concurrent jobs, 64 Mi each. Issue 26 measured 261 MiB of heap for a 128 MiB answer.
const floodPeakBound = 64 << 20

// floodLogBound is what the flooded stage may write to the job log: the agent keeps 4 KiB of the
// daemon's answer for its error, which the log may show more than once.
const floodLogBound = 64 << 10

// floodServer is a job's own server at the agent's daemon socket: it takes the socket's path
// (the job runs as the agent's user and owns its directory), logs the first line each client
// sends, then answers 1 GiB of 'A's, and logs how much went out before the client hung up.
const floodServer = `const net = require('net'), fs = require('fs');
const sock = '` + wire.BaseDir + `/agent.sock', log = m => fs.appendFileSync('/tmp/flood.log', m + '\n');
try { fs.unlinkSync(sock); } catch (e) {}
const chunk = Buffer.alloc(1 << 20, 65), total = 1 << 30;
net.createServer(c => {
  let sent = 0;
  c.on('error', e => log('error after ' + sent + ': ' + e.code));
  c.on('close', () => log('closed after ' + sent));
  c.once('data', d => {
    log('request ' + d.toString().split('\n')[0]);
    const pump = () => {
      while (sent < total) { sent += chunk.length; if (!c.write(chunk)) return c.once('drain', pump); }
      c.end();
    };
    pump();
  });
}).listen(sock, () => log('listening'));
`

// TestAgentSocketFloodIsASystemFailure: a job replaces the agent's daemon socket (agent.sock in
// the agent's directory) with its own server answering 1 GiB. Every stage start goes through that
// socket, over exec and over the network transport alike (the agent's start verb, served on the
// network path by the agent in the pod, asks the daemon at agent.sock to spawn the stage), so the
// next stage's answer is the flood: the stage must end as a system failure, and the runner-side
// run process must peak under floodPeakBound. The peak is the kernel's ru_maxrss of the process,
// read when it is reaped (wait4): exact and independent of sampling, unlike polling VmHWM, and
// unlike prlimit --as it does not trip over the Go runtime's address-space reservations.
func TestAgentSocketFloodIsASystemFailure(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	r := c.NewRunner(t, "sec-flood", "")
	j := prepared(t, r, clusterjobs.JobSpec{})

	setUp, baseline := runMeasured(t, j, `set -e
cat >/tmp/flood.js <<'EOF'
`+floodServer+`EOF
setsid -f node /tmp/flood.js </dev/null >/dev/null 2>&1
i=0; until grep -q listening /tmp/flood.log 2>/dev/null; do i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.1; done
echo flood server listening
`)
	if setUp.ExitCode != 0 || !strings.Contains(setUp.Stdout, "flood server listening") {
		t.Fatalf("the job could not put its server at agent.sock: exit %d\n%s", setUp.ExitCode, setUp.Output())
	}
	t.Logf("a normal stage's run process peaked at %d MiB", baseline>>20)

	flooded, peak := runMeasured(t, j, "echo this stage must not start\n")
	t.Logf("flooded stage: exit %d, run peaked at %d MiB, output %d bytes:\n%.2000s", flooded.ExitCode, peak>>20, len(flooded.Output()), flooded.Output())
	log, err := c.Exec(context.Background(), j.Pod, "cat", "/tmp/flood.log")
	if err != nil || !strings.Contains(log, "request spawn") {
		t.Fatalf("the job's server was never asked to spawn the stage (%v): the flood did not hit\n%s", err, log)
	}
	t.Logf("the job's server: %s", strings.ReplaceAll(strings.TrimSpace(log), "\n", "; "))
	if flooded.ExitCode != clusterjobs.SystemFailure {
		t.Errorf("the flooded stage exited %d, want %d (a system failure)", flooded.ExitCode, clusterjobs.SystemFailure)
	}
	if strings.Contains(flooded.Stdout, "this stage must not start") {
		t.Errorf("the stage ran although its start was answered by the job's server")
	}
	if n := len(flooded.Output()); n > floodLogBound {
		t.Errorf("the flooded stage wrote %d bytes to the job log, over %d: the flood reached it", n, floodLogBound)
	}
	if peak >= floodPeakBound {
		t.Errorf("run peaked at %d MiB under the flood, over the bound of %d MiB", peak>>20, floodPeakBound>>20)
	}
}

// runMeasured runs body as a build_script stage and returns how it ended and the run process's
// peak resident set in bytes (the kernel's ru_maxrss, taken when the process is reaped).
func runMeasured(t *testing.T, j *clusterjobs.Job, body string) (clusterjobs.Result, int64) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := j.Command("run", j.Script(t, body), "build_script")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := clusterjobs.Result{Stage: "run build_script", Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: clusterjobs.ExitCode(err)}
	if res.ExitCode == -1 {
		t.Fatalf("run: %v", err)
	}
	usage, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Fatalf("run's resource usage is %T, not a syscall.Rusage", cmd.ProcessState.SysUsage())
	}
	return res, usage.Maxrss << 10 // Linux reports kilobytes
}
