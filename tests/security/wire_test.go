//go:build security

package security

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

// TestNoClearTextOnThePodNetwork captures every packet on the node's pod bridge while a job over
// the network transport runs a script that exports a masked variable, prints it and prints a
// marker line: neither the secret nor a line of the script appears anywhere in the capture. As
// positive controls, the capture holds the transport's own packets (port 7543) and the job's
// deliberate plain-HTTP request to the GitLab host, payload included: the capture sees
// payloads, so the absence of the secret means something.
func TestNoClearTextOnThePodNetwork(t *testing.T) {
	c := clusterjobs.Connect(t)
	r := c.NewRunner(t, "sec-wire", `stage_transport = "network"`)
	secret := randomSecret(t, "sentinel-")
	scriptMarker := randomSecret(t, "script-line-")
	clearMarker := randomSecret(t, "clear-on-purpose-")

	pcap := filepath.Join(t.TempDir(), "pod-network.pcap")
	stop := capture(t, podBridge, pcap)

	j := r.NewJob(t, clusterjobs.JobSpec{Variables: map[string]string{"SENTINEL": secret}})
	prep := j.Prepare(t).Output()
	if !strings.Contains(prep, "stages over pod network (TLS)") {
		t.Fatalf("the job does not go over the pod network:\n%s", prep)
	}
	out := j.MustRun(t, fmt.Sprintf(`export SENTINEL='%s'
echo "%s"
echo "the secret is $SENTINEL"
curl -s -o /dev/null --max-time 5 "http://%s/%s" || true
`, secret, scriptMarker, gitlab, clearMarker)).Stdout
	if !strings.Contains(out, scriptMarker) || !strings.Contains(out, "the secret is "+secret) {
		t.Fatalf("positive control: the job did not run its script:\n%s", out)
	}
	j.Cleanup(t)
	stop()

	data, err := os.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	if n := countPackets(t, pcap, fmt.Sprintf("tcp port %d", wire.NetworkPort)); n < 10 {
		t.Fatalf("positive control: only %d packets of the transport (port %d) captured on %s", n, wire.NetworkPort, podBridge)
	}
	if !bytes.Contains(data, []byte(clearMarker)) {
		t.Fatalf("positive control: the job's plain-HTTP request (%s) is not in the capture: the capture misses payloads", clearMarker)
	}
	for what, s := range map[string]string{"the masked variable's value": secret, "a line of the script": scriptMarker, "the script's export line": "export SENTINEL"} {
		if bytes.Contains(data, []byte(s)) {
			t.Errorf("%s crossed the pod network in clear (%d bytes captured)", what, len(data))
		}
	}
	t.Logf("captured %d bytes on %s; the transport's packets carry neither the secret nor the script", len(data), podBridge)
}

// capture runs tcpdump on iface into file (whole packets, written as they come) and returns a
// function that stops it, flushed. tcpdump is ours to stop: it is ended by its PID.
func capture(t *testing.T, iface, file string) func() {
	t.Helper()
	tcpdump, err := exec.LookPath("tcpdump")
	if err != nil {
		t.Fatalf("tcpdump is missing (tests/cluster/deps.sh installs it): %v", err)
	}
	// -Z root: tcpdump would otherwise drop to its own user, who cannot write into the test's
	// private temporary directory.
	cmd := exec.Command(tcpdump, "-i", iface, "-s", "0", "-U", "-n", "-Z", "root", "-w", file)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var seen []string
		for sc.Scan() {
			seen = append(seen, sc.Text())
			if strings.Contains(sc.Text(), "listening on "+iface) {
				listening <- ""
			}
		}
		listening <- strings.Join(seen, "; ")
	}()
	select {
	case msg := <-listening:
		if msg != "" {
			t.Fatalf("tcpdump on %s ended: %s", iface, msg)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("tcpdump on %s did not start listening", iface)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	}
	t.Cleanup(stop)
	return stop
}

// countPackets is how many packets of file match filter.
func countPackets(t *testing.T, file, filter string) int {
	t.Helper()
	out, err := exec.Command("tcpdump", "-n", "-r", file, filter).Output()
	if err != nil {
		t.Fatalf("reading %s: %v", file, err)
	}
	return strings.Count(string(out), "\n")
}
