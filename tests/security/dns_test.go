//go:build security

package security

import (
	"context"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// dnsStandIn answers every query with an A record for the GitLab instance (10.99.1.2): a
// resolver that is not cluster DNS.
const dnsStandIn = `const d = require("dgram").createSocket("udp4");
d.on("message", (m, r) => {
  let i = 12; while (m[i]) i += m[i] + 1;
  const header = Buffer.from([m[0], m[1], 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0]);
  const answer = Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 99, 1, 2]);
  d.send(Buffer.concat([header, m.subarray(12, i + 5), answer]), r.port, r.address);
});
d.bind(53);`

// TestJobResolvesOnlyThroughClusterDNS: the template lets jobs send DNS to the cluster's DNS
// pods (kube-system, k8s-app=kube-dns) and nowhere else. The cluster's CoreDNS answers at the
// kube-dns Service; a stand-in resolver runs in kube-system under another label. Both answer the
// node; the job gets answers from cluster DNS and none from the stand-in.
func TestJobResolvesOnlyThroughClusterDNS(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	other := startResolver(t, c, "sec-dns-other-"+fmt.Sprint(os.Getpid()), map[string]string{"k8s-app": "not-dns"})
	const clusterName = "kubernetes.default.svc.cluster.local"
	if !hostResolves(t, clusterDNS, clusterName, kubernetesService) {
		t.Fatalf("positive control: cluster DNS at %s does not answer the node", clusterDNS)
	}
	if !hostResolves(t, other, "gitlab.example.test", gitlab) {
		t.Fatalf("positive control: the stand-in resolver at %s does not answer the node", other)
	}

	r := c.NewRunner(t, "sec-dns", "")
	j := prepared(t, r, clusterjobs.JobSpec{})
	out := j.MustRun(t, fmt.Sprintf(`q() {
  node -e 'const r = new (require("dns").promises.Resolver)({timeout: 3000, tries: 1}); r.setServers([process.argv[1]]);
    r.resolve4(process.argv[3]).then(a => console.log("@dns", process.argv[2], "answer", a.join(",")), e => console.log("@dns", process.argv[2], "error", e.code))' "$1" "$2" "$3" &
}
q %s cluster-dns %s
q %s other-resolver gitlab.example.test
wait
`, clusterDNS, clusterName, other)).Stdout
	answers := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^@dns (\S+) (.*)$`).FindAllStringSubmatch(out, -1) {
		answers[m[1]] = m[2]
	}
	if answers["cluster-dns"] != "answer "+kubernetesService {
		t.Fatalf("positive control: the job gets no answer from cluster DNS at %s: %q\n%s", clusterDNS, answers["cluster-dns"], out)
	}
	t.Logf("cluster DNS answers the job: %s", answers["cluster-dns"])
	if a := answers["other-resolver"]; !strings.HasPrefix(a, "error") {
		t.Errorf("the resolver that is not cluster DNS (%s) answered the job: %q", other, a)
	} else {
		t.Logf("the other resolver gives the job no answer, as expected (%s)", a)
	}
}

// startResolver runs the stand-in resolver in a pod of kube-system and returns its IP once the
// pod runs; the pod is deleted at the end.
func startResolver(t *testing.T, c *clusterjobs.Cluster, name string, labels map[string]string) string {
	t.Helper()
	labels[suiteLabel] = "true"
	pods := c.Admin.Kube.CoreV1().Pods("kube-system")
	grace := int64(0)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: new(bool), EnableServiceLinks: new(bool), TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "dns", Image: localcluster.CIImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"node", "-e", dnsStandIn},
			}},
		},
	}
	ctx := context.Background()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pods.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting pod kube-system/%s: %v", name, err)
		}
	})
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p.Status.PodIP
		}
	}
	t.Fatalf("pod kube-system/%s is not running after 2 minutes", name)
	return ""
}

// hostResolves asks the resolver at ip from the node for name, retrying while the pod's server
// starts, and says whether it answered want.
func hostResolves(t *testing.T, ip, name, want string) bool {
	t.Helper()
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(nodeIP)}}
		return d.DialContext(ctx, "udp", net.JoinHostPort(ip, "53"))
	}}
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var addrs []net.IP
		addrs, err = res.LookupIP(ctx, "ip4", name)
		cancel()
		if err == nil && len(addrs) > 0 && addrs[0].String() == want {
			return true
		}
	}
	t.Logf("resolver %s from the node: %v", ip, err)
	return false
}
