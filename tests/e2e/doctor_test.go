//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// runDoctor runs the built binary's doctor command and returns its lines and exit code.
func runDoctor(t *testing.T, c *clusterjobs.Runner, configPath string, args ...string) ([]string, int) {
	t.Helper()
	cmd := exec.Command(c.Binary(), append([]string{"--config", configPath, "doctor"}, args...)...)
	cmd.Env = os.Environ()
	out, err := cmd.Output()
	t.Logf("doctor %v:\n%s", args, out)
	return strings.Split(strings.TrimSpace(string(out)), "\n"), clusterjobs.ExitCode(err)
}

// waitPoolsReady is the precondition of an all-ok run: other tests drain the pools for a moment.
func waitPoolsReady(t *testing.T, c *clusterjobs.Runner, pools ...string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for _, name := range pools {
		for {
			p, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Status.ReadyReplicas > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool %s has no Ready sandbox after 2 minutes", name)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// On the local cluster as the chart (deploy/local/values.yaml) leaves it, with the executor's own
// ServiceAccount, every check passes: CRDs, each verb of the Role, the RuntimeClass, both pools,
// their templates and the NetworkPolicies agent-sandbox made for them, and what the netfence init
// container of duo-default's pods found of the cluster's runsc.
func TestDoctorAllOKOnLocalCluster(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	var lines []string
	var code int
	// Concurrent tests' jobs claim from both pools: one may take a pool's last Ready sandbox
	// between the wait and doctor's read, which doctor rightly warns about. Only then is doctor
	// run again, for a bounded time; whatever the last run says is judged below.
	for deadline := time.Now().Add(5 * time.Minute); ; {
		waitPoolsReady(t, c, pool, localcluster.PosixPool)
		lines, code = runDoctor(t, c, c.ConfigPath)
		drained := onlyDrainedPools(lines, pool, localcluster.PosixPool)
		if len(drained) == 0 || time.Now().After(deadline) {
			break
		}
		t.Logf("pools %v drained by concurrent jobs since the wait: doctor again", drained)
	}
	if code != 0 {
		t.Errorf("doctor exited %d, want 0", code)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "ok    ") {
			t.Errorf("not ok: %s", l)
		}
	}
	want := []string{
		"ok    kubernetes API: server v1.",
		"ok    crd sandboxes.agents.x-k8s.io: served versions ",
		"ok    crd sandboxclaims.extensions.agents.x-k8s.io: served versions ",
		"ok    crd sandboxtemplates.extensions.agents.x-k8s.io: served versions ",
		"ok    crd sandboxwarmpools.extensions.agents.x-k8s.io: served versions ",
		"ok    runtimeclass gvisor: handler runsc",
		"ok    pool duo-default: ",
		"ok    pool duo-posix: ",
		"ok    template duo-gvisor (pool duo-default): runtimeClassName gvisor",
		"ok    template posix-gvisor (pool duo-posix): runtimeClassName gvisor",
		"ok    pool duo-default images: " + localcluster.CIImage + ", exactly",
		"ok    pool duo-posix images: " + localcluster.PosixImage + ", exactly",
		"ok    networkpolicy duo-gvisor: NetworkPolicy duo-gvisor-network-policy restricts ingress and egress",
		"ok    networkpolicy posix-gvisor: NetworkPolicy posix-gvisor-network-policy restricts ingress and egress",
		// duo-gvisor's pods proved the cluster's runsc keeps jobs from rewriting the netstack
		// fence (posix-gvisor copies the agent in and has no netfence).
		"ok    netfence pool duo-default: in ",
	}
	for _, p := range kube.RequiredPermissions {
		want = append(want, "ok    rbac "+p.String()+": allowed in namespace "+namespace)
	}
	for _, w := range want {
		if !hasLinePrefix(lines, w) {
			t.Errorf("no line starting %q", w)
		}
	}
	if len(lines) != len(want) {
		t.Errorf("%d lines, want %d", len(lines), len(want))
	}
}

// A config naming a pool the cluster does not have: one FAIL line names the pool and the fix,
// the rest still runs, and doctor exits 1.
func TestDoctorMissingPoolFails(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	missing := fmt.Sprintf("e2e-missing-%d", os.Getpid())
	pools := append(localcluster.Pools(pool), localcluster.PoolConfig{Name: missing})
	path := newRunner(t, c.Cluster, localcluster.Config{Pools: pools}).ConfigPath
	lines, code := runDoctor(t, c, path)
	if code != 1 {
		t.Errorf("doctor exited %d, want 1", code)
	}
	want := regexp.MustCompile(`^FAIL  pool ` + missing + `: SandboxWarmPool "` + missing + `" not found in namespace "sandbox-executor"; fix: add it to the chart.s pools values .* or correct the \[\[pool\]\] name in ` + regexp.QuoteMeta(path) + `$`)
	fails := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "FAIL") {
			fails++
			if !want.MatchString(l) {
				t.Errorf("unexpected FAIL line: %s", l)
			}
		}
	}
	if fails != 1 {
		t.Errorf("%d FAIL lines, want exactly the missing pool's", fails)
	}
	if !hasLinePrefix(lines, "ok    rbac create sandboxclaims.extensions.agents.x-k8s.io") {
		t.Error("the other checks must still run")
	}
}

// With cluster-admin credentials, --kubelet reads the node's kubelet configuration through the
// API server's node proxy, and reports the same podPidsLimit that kubectl reads there.
func TestDoctorKubeletPidsLimit(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	// The local cluster's one real node: $NODE_NAME, else the lower-cased host name (tests/cluster/lib.sh).
	node := os.Getenv("NODE_NAME")
	if node == "" {
		host, err := os.Hostname()
		if err != nil {
			t.Fatal(err)
		}
		node = strings.ToLower(host)
	}
	raw, err := exec.Command(filepath.Join(c.Dir, "bin", "kubectl"), "--kubeconfig", c.AdminKubeconfig(), "get", "--raw", "/api/v1/nodes/"+node+"/proxy/configz").Output()
	if err != nil {
		t.Fatalf("kubectl get configz of node %s: %v", node, err)
	}
	var z struct {
		KubeletConfig struct {
			PodPidsLimit *int64 `json:"podPidsLimit"`
		} `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw, &z); err != nil {
		t.Fatal(err)
	}
	want := "warn  pids limit node " + node + ": podPidsLimit unset"
	if l := z.KubeletConfig.PodPidsLimit; l != nil && *l > 0 {
		want = fmt.Sprintf("ok    pids limit node %s: podPidsLimit %d", node, *l)
	}
	lines, _ := runDoctor(t, c, c.AdminConfig, "--kubelet")
	if !hasLinePrefix(lines, want) {
		t.Errorf("no line starting %q", want)
	}
}

// drainedPoolWarning is doctor's warning for a pool with replicas but none Ready at the moment
// (operator/doctor/pools.go): claims leave a pool so until it refills.
var drainedPoolWarning = regexp.MustCompile(`^warn  pool (\S+): 0 of [1-9][0-9]* sandboxes Ready `)

// drainedNetfenceWarning is doctor's warning for a pool none of whose pods has run netfence yet
// (operator/doctor/netfence.go): a drained pool's new pods, while its claimed ones left it.
var drainedNetfenceWarning = regexp.MustCompile(`^warn  netfence pool (\S+): .* none of the pool's [0-9]+ pods has run it yet`)

// onlyDrainedPools names the drained pools if warnings that one of pools is drained are doctor's
// only lines that are not ok; else it returns none.
func onlyDrainedPools(lines []string, pools ...string) []string {
	var drained []string
	for _, l := range lines {
		if strings.HasPrefix(l, "ok    ") {
			continue
		}
		m := drainedPoolWarning.FindStringSubmatch(l)
		if m == nil {
			m = drainedNetfenceWarning.FindStringSubmatch(l)
		}
		if m == nil || !slices.Contains(pools, m[1]) {
			return nil
		}
		drained = append(drained, m[1])
	}
	return drained
}

func hasLinePrefix(lines []string, prefix string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}
