//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// What deploy/local and tests/cluster/egress-proxy.sh set up: pool duo-proxied, whose pods may
// open TCP to the egress proxy at 10.99.2.2:3128 and nothing else; the proxy allows
// gitlab.sandbox.test (10.99.1.2, "the GitLab instance") and knows outside.sandbox.test
// (10.99.0.2, "the internet") without allowing it.
const (
	proxiedPool = "duo-proxied"
	egressAdmin = localcluster.EgressAdminAddr
)

// TestEgressThroughProxy runs a job in the proxied pool: allowlisted hosts are reached through
// the proxy (forwarded and tunnelled), others are refused by the proxy with a 403, bypassing the
// proxy is dropped by NetworkPolicy, and the job log names every destination the proxy refused.
func TestEgressThroughProxy(t *testing.T) {
	t.Parallel()
	// The proxied pool is the default one; the CI and POSIX images keep their pools.
	pools := append([]localcluster.PoolConfig{{Name: proxiedPool, EgressProxy: egressAdmin}}, localcluster.Pools(pool)...)
	c := newRunner(t, clusterjobs.Connect(t), localcluster.Config{Pools: pools})

	j, _, prep := preparedJob(t, c, "") // no image: the default pool
	mustContain(t, "prepare log", prep, "pool "+proxiedPool)
	podIP := j.PodObject(t).Status.PodIP
	// The proxy keeps blocked attempts by client address, which an earlier pod (another test's)
	// may have had: only what the proxy saw after prepare, when the address was this job's, counts.
	jobStart := time.Now()
	run := func(name, script string) string {
		t.Helper()
		out, err := j.Command("run", j.Script(t, script), "build_script").CombinedOutput()
		if err != nil {
			t.Fatalf("stage %s: %v\n%s", name, err, out)
		}
		t.Logf("stage %s:\n%s", name, out)
		return string(out)
	}

	// Allowed: by name through the proxy, as a forwarded request and through a CONNECT tunnel
	// (curl -p), on both allowlisted ports. Nothing is reported for them.
	out := run("allowed", `set -e
echo "proxy=$HTTP_PROXY"
echo "forwarded=$(curl -sS --max-time 20 http://gitlab.sandbox.test/)"
echo "tunnelled=$(curl -sS -p --max-time 20 http://gitlab.sandbox.test/)"
echo "alt=$(curl -sS --max-time 20 http://gitlab.sandbox.test:9090/)"
`)
	mustContain(t, "allowed stage", out, "proxy=http://10.99.2.2:3128", "forwarded=gitlab", "tunnelled=gitlab", "alt=gitlab-alt")
	if strings.Contains(out, "egress blocked") {
		t.Errorf("allowed traffic reported as blocked:\n%s", out)
	}

	// Refused by the proxy: a known name that is not allowlisted (forwarded and tunnelled), an
	// IP literal, and an https URL (CONNECT). curl sees the proxy's 403.
	out = run("refused", `
echo "get=$(curl -s --max-time 20 -w ' http=%{http_code}' http://outside.sandbox.test/)"
curl -s -p --max-time 20 -o /dev/null -w 'connect=%{http_connect}\n' http://outside.sandbox.test/
echo "literal=$(curl -s --max-time 20 -w ' http=%{http_code}' http://10.99.0.2/)"
curl -s --max-time 20 -o /dev/null -w 'https-connect=%{http_connect}\n' https://evil.example/
curl -s --max-time 20 -o /dev/null https://evil.example/
true
`)
	mustContain(t, "refused stage", out,
		"get=egress proxy: GET outside.sandbox.test:80 blocked: not in the allowlist", "http=403",
		"connect=403",
		"literal=egress proxy: GET 10.99.0.2:80 blocked: not in the allowlist",
		"https-connect=403",
		// The job log, written by our run stage after the script.
		"WARNING: egress blocked: GET outside.sandbox.test:80 (not in the allowlist of pool duo-proxied)",
		"WARNING: egress blocked: CONNECT outside.sandbox.test:80 (not in the allowlist of pool duo-proxied)",
		"WARNING: egress blocked: GET 10.99.0.2:80 (not in the allowlist of pool duo-proxied)",
		"WARNING: egress blocked: CONNECT evil.example:443 (not in the allowlist of pool duo-proxied; 2 attempts)")
	if strings.Contains(out, "gitlab.sandbox.test") {
		t.Errorf("the previous stage's allowed traffic is in this stage's report:\n%s", out)
	}
	// The proxy saw the pod's own address (no NAT), so the report since the job began is this
	// pod's and no other's.
	tokenFile, err := localcluster.EgressAdminTokenFile()
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	egressHTTP, err := localcluster.EgressAdminHTTP(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b, err := (&adminclient.Client{Base: egressAdmin, Token: strings.TrimSpace(string(token)), HTTP: egressHTTP}).QueryBlocked(context.Background(), podIP, jobStart)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Blocked) != 5 {
		t.Errorf("the proxy holds %d blocked attempts of %s, want 5: %+v", len(b.Blocked), podIP, b.Blocked)
	}

	// Bypassing the proxy. Positive control first: the same pod, over the same route, reaches the
	// proxy's own address directly (it answers that it is a proxy). Direct connections elsewhere
	// are dropped, and stay dropped when an extra NetworkPolicy allows them: the pod's netstack
	// fence (its own iptables, docs/security.md#the-netstack-fence) still drops them. That such a
	// policy does open a pod without that fence is TestNetstackFenceHoldsThroughPolicyAgentRestarts's
	// canary (tests/security).
	out = run("direct-control", `echo "direct-to-proxy=$(curl -s --noproxy '*' --max-time 20 http://10.99.2.2:3128/)"`)
	mustContain(t, "direct-control stage", out, "direct-to-proxy=egress proxy: this is a forward proxy")
	out = run("direct-dropped", pollDirect("http://10.99.0.2/", "")+pollDirect("http://10.99.1.2/", ""))
	mustContain(t, "direct-dropped stage", out, "direct=dropped http://10.99.0.2/", "direct=dropped http://10.99.1.2/")
	allowDirect(t, j, "10.99.0.2/32", 80)
	out = run("direct-allowed-by-policy", `for i in $(seq 10); do curl -s --noproxy '*' --max-time 1 http://10.99.0.2/ && echo " REACHED"; sleep 1; done; echo tried`)
	if !strings.Contains(out, "tried") || strings.Contains(out, "REACHED") {
		t.Errorf("a NetworkPolicy opened the pod's egress past its netstack fence:\n%s", out)
	}
}

// pollDirect is a stage that connects to url without the proxy until it gets want ("" = until two
// attempts in a row fail: a policy change takes a moment to reach the node's rules), for at
// most a minute, and prints what it saw.
func pollDirect(url, want string) string {
	return fmt.Sprintf(`fails=0; i=0
while [ $i -lt 30 ]; do
  i=$((i+1))
  if got=$(curl -s --noproxy '*' --max-time 2 %[1]s); then
    fails=0
    if [ -n %[2]q ] && [ "$got" = %[2]q ]; then echo "direct=$got"; break; fi
  else
    fails=$((fails+1))
    if [ -z %[2]q ] && [ $fails -ge 2 ]; then echo "direct=dropped %[1]s"; break; fi
  fi
  sleep 1
done
`, url, want)
}

// allowDirect adds a NetworkPolicy that lets only this pod reach cidr:port directly, removed at
// the end of the test.
func allowDirect(t *testing.T, j *clusterjobs.Job, cidr string, port int) string {
	t.Helper()
	ctx := context.Background()
	p := j.PodObject(t)
	const podLabel = "agents.x-k8s.io/sandbox-name-hash"
	if p.Labels[podLabel] == "" {
		t.Fatalf("pod %s has no label %s to select it by", p.Name, podLabel)
	}
	tcp, portValue := corev1.ProtocolTCP, intstr.FromInt32(int32(port))
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-egress-control-" + p.Labels[podLabel]},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{podLabel: p.Labels[podLabel]}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &portValue}},
			}},
		},
	}
	if _, err := j.Admin.Kube.NetworkingV1().NetworkPolicies(namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		j.Admin.Kube.NetworkingV1().NetworkPolicies(namespace).Delete(context.Background(), np.Name, metav1.DeleteOptions{})
	})
	return np.Name
}
