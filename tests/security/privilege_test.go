//go:build security

package security

import (
	"crypto/tls"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

// Capabilities a job must not have: each one is a known way out of a container or into the
// node's network.
var forbiddenCaps = map[string]uint{
	"CAP_DAC_READ_SEARCH": 2, "CAP_NET_BIND_SERVICE": 10, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13,
	"CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_CHROOT": 18, "CAP_SYS_PTRACE": 19,
	"CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22, "CAP_SYS_TIME": 25, "CAP_MKNOD": 27,
	"CAP_AUDIT_CONTROL": 30, "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34, "CAP_BPF": 39,
}

// TestJobHasNoPrivilege: the job has no CAP_SYS_ADMIN nor any other capability that opens a way
// out (effective and bounding sets), no_new_privs is set, and a real mount fails.
func TestJobHasNoPrivilege(t *testing.T) {
	t.Parallel()
	r := clusterjobs.Connect(t).NewRunner(t, "sec-priv", "")
	j := prepared(t, r, clusterjobs.JobSpec{})
	// gVisor's /proc/self/status has no NoNewPrivs line; setpriv asks the kernel (prctl).
	out := j.MustRun(t, "grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status\nsetpriv --dump | grep no_new_privs\n"+
		"mount -t tmpfs none /mnt 2>&1; echo \"mount-exit=$?\"\n").Stdout
	for _, set := range []string{"CapEff", "CapBnd"} {
		m := regexp.MustCompile(`(?m)^` + set + `:\s+([0-9a-f]+)$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no %s in the job's /proc/self/status:\n%s", set, out)
		}
		caps, err := strconv.ParseUint(m[1], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		for name, bit := range forbiddenCaps {
			if caps&(1<<bit) != 0 {
				t.Errorf("%s %s includes %s", set, m[1], name)
			}
		}
		t.Logf("%s = %s", set, m[1])
	}
	if !strings.Contains(out, "no_new_privs: 1") {
		t.Errorf("no_new_privs is not set in the job:\n%s", out)
	}
	if strings.Contains(out, "NoNewPrivs:") && !regexp.MustCompile(`(?m)^NoNewPrivs:\s+1$`).MatchString(out) {
		t.Errorf("/proc/self/status says NoNewPrivs is off:\n%s", out)
	}
	if strings.Contains(out, "mount-exit=0") || !strings.Contains(out, "mount-exit=") {
		t.Errorf("the job could mount a filesystem:\n%s", out)
	}
}

// TestJobCannotReachKubernetesAPI: the job has no service-account token, and cannot connect to
// the API server, neither at the node's address nor at the kubernetes Service IP (both of which
// answer the runner host: the positive controls). kube-proxy routes the Service IP to the node
// address, and the node lets pods through that way (in-cluster controllers, CoreDNS and runners
// use it): the job's NetworkPolicy is what keeps it out, and this proves it does.
func TestJobCannotReachKubernetesAPI(t *testing.T) {
	t.Parallel()
	r := clusterjobs.Connect(t).NewRunner(t, "sec-api", "")
	apiURL := httpsURL(nodeIP, 6443, "/version")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Get(apiURL)
	if err != nil {
		t.Fatalf("positive control: the API server does not answer at %s from the node: %v", apiURL, err)
	}
	resp.Body.Close()
	t.Logf("the API server answers at %s from the node: %s", apiURL, resp.Status)
	serviceURL := httpsURL(kubernetesService, 443, "/version")
	resp, err = client.Get(serviceURL)
	if err != nil {
		t.Fatalf("positive control: the API server does not answer at its Service %s from the node: %v", serviceURL, err)
	}
	resp.Body.Close()

	j := prepared(t, r, clusterjobs.JobSpec{})
	out := j.MustRun(t, probeLib+
		`echo "service-host=${KUBERNETES_SERVICE_HOST:-unset}:${KUBERNETES_SERVICE_PORT:-}"
ls -a /var/run/secrets/kubernetes.io/serviceaccount 2>&1 | head -n 3
probe control-gitlab `+url(gitlab, 80, "/")+`
probe api-node `+apiURL+`
probe api-service-ip `+serviceURL+`
[ -n "$KUBERNETES_SERVICE_HOST" ] && probe api-service "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version"
probes
`).Stdout
	if !strings.Contains(out, "No such file or directory") {
		t.Errorf("the job sees a service-account token directory:\n%s", out)
	}
	res := probeResults(t, out)
	mustControls(t, reachable(t, res, "control-gitlab", "gitlab"))
	blocked(t, res, "api-node")
	blocked(t, res, "api-service-ip")
	if strings.Contains(out, "service-host=unset") {
		t.Log("KUBERNETES_SERVICE_HOST is not set in the job")
	} else {
		t.Logf("the job's environment has %s", regexp.MustCompile(`service-host=\S+`).FindString(out))
		blocked(t, res, "api-service")
	}
}
