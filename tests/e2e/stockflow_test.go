//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/records"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// the duo-flow pools of the chart's values-duo-flow.yaml, as deploy/local/values.yaml has them on the local cluster, serving the stand-ins of
// GitLab's flow images (tests/cluster/images-duo.sh) through the egress proxy.
const (
	flowPool      = "duo-flow"
	flowImage     = "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image:v0.0.21"
	hardenedPool  = "duo-flow-hardened"
	hardenedImage = "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image-hardened:v0.0.21"
	// flowEgressAdmin is the proxy of these pools: deploy/local's (tests/cluster/egress-proxy.sh).
	flowEgressAdmin = egressAdmin
	// jobEgressAdmin is the proxy's admin address as the stock job tries it, through the proxy
	// (HTTP_PROXY), which must refuse to forward to it: a plain-HTTP PUT, so that the proxy sees
	// and reports the method.
	jobEgressAdmin = "http://10.99.2.2:3129"
)

// TestStockDuoFlow runs the stock flow's shape through gitlab-runner 17.9: a job with no image,
// served by the pool of GitLab's default image, whose egress is what the executor derives from
// the job (the instance of CI_SERVER_URL) plus the pool's npm registry, through the egress
// proxy. In order: setup_script as the image's user (root); the duo CLI found in the image
// (v0.0.11 and later ship it), not installed; the repository cloned; SRT probed and falling back
// (gVisor and the fence are the sandbox, as the job log says); the CLI writing its ripgrep into
// $HOME as 9.29.0 does; a WebSocket session with the workflow service through the
// instance; edit, test, commit, push; a merge request with CI_JOB_TOKEN; and a destination
// nothing allows, refused and named in the job log. Then what became of the project's
// agent-config.yml network_policy (duoflow.StockNetworkPolicy), which GitLab wrote into SRT's
// settings and the job log says is not applied: a domain it allows, one it denies and GitLab's
// recommended ones are refused unless the pool grants them; the npm registry, denied but granted by
// the pool, is reached; and no socket of the node or its runtime is in the pod, whose Unix
// sockets are its own and work (networkPolicyChecks).
func TestStockDuoFlow(t *testing.T) {
	t.Parallel()
	npm, err := duoflow.NewNPMRegistry()
	if err != nil {
		t.Fatal(err)
	}
	defer npm.Close()
	// The instance is granted from the job itself; only the npm registry is the pool's, a
	// registry the project's network_policy denies (networkPolicyChecks). The image has the duo
	// CLI: the flow does not install it.
	inst, c, base := newFlowRunner(t,
		localcluster.PoolConfig{Name: flowPool, Images: []string{flowImage}, ServeOtherTags: true, EgressProxy: flowEgressAdmin, EgressInstance: true, EgressAllow: []string{npm.Host + ":80"}})
	job := inst.StockJob(base, npm.URL, jobEgressAdmin,
		`echo "setup_script: running as $(id -un) (uid $(id -u)) in $(pwd)"`)
	job.Steps[0].Script = append(job.Steps[0].Script, networkPolicyChecks...)
	res := runDuoJob(t, c, inst, job)
	trace := res.Trace

	mustContainInOrder(t, trace,
		"Sandbox ready: pool "+flowPool,
		"Isolation: this flow runs under gVisor (RuntimeClass gvisor), not SRT, fenced by its NetworkPolicy and the egress proxy of pool "+flowPool+"; SRT in this image cannot build its own sandbox",
		"Network policy: agent-config.yml's network_policy configures SRT and is not applied here: this job reaches only what the egress proxy of pool "+flowPool+" allows",
		"Fetching changes with git depth set to 1",
		"setup_script: running as root (uid 0)",
		"duo-cli already present, skipping installation",
		"/usr/local/bin/duo",
		"0.0.0-standin",
		"Warning: SRT found but can't create sandbox (insufficient privileges), running command directly",
		"duo: $HOME is writable: wrote /root/"+duoflow.RipgrepInHome+" (ripgrep from /usr/bin/rg)",
		"duo: session "+strconv.FormatInt(job.ID, 10)+": connected (websocket)",
		"tests passed: welcome, farewell",
		"merge request !1",
		"duo: session "+strconv.FormatInt(job.ID, 10)+": finished: 7 actions done",
		// The job cannot grant itself more egress: the proxy does not forward to its admin port.
		"self-grant: HTTP 403",
		// agent-config.yml's network_policy.allowed_domains reached SRT's settings only: the
		// proxy refuses the domain all the same.
		"outside: HTTP 403",
		// denied_domains: the npm registry, which the pool grants, is reached; a denied
		// domain nothing grants is refused.
		"denied, granted by the pool: HTTP 200",
		"denied, granted by nothing: HTTP 403",
		// include_recommended_allowed: GitLab's recommended domains stay refused.
		"recommended pypi.org: CONNECT 403",
		"recommended rubygems.org: CONNECT 403",
		// allow_all_unix_sockets: nothing of the node's in the pod; the job's own sockets work.
		"host and runtime sockets in the pod: none",
		"unix sockets in the kernel before: ["+agentSocket+"]",
		"the job's own unix socket: pong",
		"unix sockets in the kernel after: ["+agentSocket+" "+jobSocket+"]",
		"unix sockets on the filesystem: ["+agentSocket+" "+jobSocket+"]",
		"egress blocked: PUT "+strings.TrimPrefix(jobEgressAdmin, "http://")+" (not in the allowlist of pool "+flowPool+")",
		"egress blocked: GET "+duoflow.ProjectAllowedDomain+":80 (not in the allowlist of pool "+flowPool+")",
		"egress blocked: GET "+duoflow.ProjectDeniedDomain+":80 (not in the allowlist of pool "+flowPool+")",
		"egress blocked: CONNECT pypi.org:443 (not in the allowlist of pool "+flowPool+")",
		"egress blocked: CONNECT rubygems.org:443 (not in the allowlist of pool "+flowPool+")",
	)
	mustContain(t, "trace", trace, "Egress of this job through the egress proxy of pool "+flowPool+": "+inst.Host+":80, "+inst.Host+":443, "+npm.Host+":80")
	if strings.Contains(trace, "egress blocked: GET "+npm.Host) {
		t.Errorf("the npm registry the pool grants was refused:\n%s", trace)
	}
	if n := npm.Downloads("@gitlab/duo-cli"); n != 0 {
		t.Errorf("@gitlab/duo-cli downloaded %d times, want none: the image has it", n)
	}
	sessions := inst.Workflows.Sessions(strconv.FormatInt(job.ID, 10))
	if len(sessions) != 1 || !sessions[0].Finished || len(sessions[0].Replies) != 7 {
		t.Fatalf("workflow service sessions: %+v (refused %d)", sessions, inst.Workflows.Refused())
	}
	branch := duoflow.Branch(job.ID)
	assertPushed(t, inst, branch, base)
	mrs := inst.GitLab.MergeRequests()
	if len(mrs) != 1 || mrs[0].JobID != job.ID || mrs[0].SourceBranch != branch || mrs[0].Title != duoflow.StockMergeRequestTitle {
		t.Errorf("merge requests: %+v, want one from %s by job %d", mrs, branch, job.ID)
	}
	for _, v := range job.Variables {
		if v.Masked && strings.Contains(trace, v.Value) {
			t.Errorf("the value of %s appears in the trace", v.Key)
		}
	}
	c.WaitJobGone(t, job.ID)
	for _, line := range strings.Split(ansiColor.ReplaceAllString(trace, ""), "\n") {
		for _, prefix := range []string{"Network policy:", "denied, ", "recommended ", "host and runtime", "unix sockets", "the job's own", "WARNING: egress blocked"} {
			if strings.HasPrefix(line, prefix) {
				t.Logf("network_policy: %s", line)
			}
		}
	}
	t.Logf("job %d: %s in %s (handed out -> final state)", job.ID, res.State, res.Duration())
}

// ansiColor is a color code of the job log.
var ansiColor = regexp.MustCompile(`\x1b\[[0-9;]*m`)

// The Unix sockets of a stock flow's pod: the stage agent's (wire.BaseDir), and the one the
// job's networkPolicyChecks make.
const (
	agentSocket = "/tmp/.sandbox-executor/agent.sock"
	jobSocket   = "/tmp/duo-job.sock"
)

// networkPolicyChecks try, after the stock flow, what its project's network_policy
// (duoflow.StockNetworkPolicy) would have SRT decide, in GitLab's default image (root, socat):
// the npm registry it denies and the pool grants; a domain it denies and nothing grants; two of
// GitLab's recommended domains (PyPI and RubyGems, the first of its Python and Ruby lists), by
// name through the proxy, which decides on the name before resolving it; the sockets of Docker,
// containerd, CRI-O, Podman, the kubelet, D-Bus and systemd at their usual paths; every Unix
// socket in the pod's kernel (gVisor's /proc/net/unix) before and after the job serves one to
// itself, and on its whole filesystem after (one `find /`: a second costs a second under gVisor).
var networkPolicyChecks = []string{
	`if curl -sS --max-time 10 -o /dev/null -w "denied, granted by the pool: HTTP %{http_code}\n" "${` + duoflow.NPMRegistryVariable + `}@gitlab%2fduo-cli"; then :; fi`,
	`if curl -sS --max-time 10 -o /dev/null -w "denied, granted by nothing: HTTP %{http_code}\n" http://` + duoflow.ProjectDeniedDomain + `/; then :; fi`,
	`for d in pypi.org rubygems.org; do if curl -sS --max-time 10 -o /dev/null -w "recommended $d: CONNECT %{http_connect}\n" "https://$d/"; then :; fi; done`,
	`found=""; for s in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock /var/run/containerd/containerd.sock /run/crio/crio.sock /run/podman/podman.sock /var/lib/kubelet/kubelet.sock /var/lib/kubelet/pod-resources/kubelet.sock /var/lib/kubelet/device-plugins/kubelet.sock /run/dbus/system_bus_socket /run/systemd/private; do if [ -e "$s" ]; then found="$found $s"; fi; done; echo "host and runtime sockets in the pod:${found:- none}"`,
	`unix_sockets() { awk 'NR > 1 && $8 != "" {print $8}' /proc/net/unix | LC_ALL=C sort -u | paste -sd ' '; }`,
	`echo "unix sockets in the kernel before: [$(unix_sockets)]"`,
	// The server reads the ping before it answers: answering at once and closing raced the
	// client's write of it (EPIPE, and socat exited without the answer: make check 03:39Z).
	`socat UNIX-LISTEN:` + jobSocket + `,fork SYSTEM:'read ping; echo pong' & socket_server=$!`,
	`until [ -S ` + jobSocket + ` ]; do sleep 0.1; done`,
	`echo "the job's own unix socket: $(echo ping | socat -t 30 - UNIX-CONNECT:` + jobSocket + `)"`,
	`echo "unix sockets in the kernel after: [$(unix_sockets)]"`,
	`echo "unix sockets on the filesystem: [$(find / -type s 2>/dev/null | LC_ALL=C sort | paste -sd ' ')]"`,
	`kill "$socket_server"`,
}

// TestStockDuoFlowHardenedImage runs the same flow with agent-config.yml naming GitLab's
// hardened image: its pool (duo-flow-hardened) serves it; setup_script runs as the image's USER,
// UID 1001; the duo CLI is in the image, so the pool grants no npm registry and none is needed;
// there is no SRT; the cache key is agent-config.yml's `key: {files, prefix}` as GitLab
// computes it, and the cache goes through the runner's helper baked into the pool's pods
// (deploy/local's agent image carries it: prepare links it, nothing is copied); and
// agent-config.yml's id_tokens reach the setup_script as GitLab sends them, a masked job
// variable (GITLAB_OIDC_TOKEN) whose value appears in no version of any pod, claim
// or sandbox of the namespace, no container log of the job's pod, no event, nothing the
// executor printed in any stage, nor the runner's log.
func TestStockDuoFlowHardenedImage(t *testing.T) {
	t.Parallel()
	inst, c, base := newFlowRunner(t,
		localcluster.PoolConfig{Name: hardenedPool, Images: []string{hardenedImage}, ServeOtherTags: true, EgressProxy: flowEgressAdmin, EgressInstance: true})
	key, err := inst.FilesCacheKey("duo-workflow", base, "package.json", ".npmrc")
	if err != nil {
		t.Fatal(err)
	}
	idToken, err := fakegitlab.NewIDToken(inst.GitLab.URL(), "https://vault.example.com", "project_path:"+duoflow.Project+":ref_type:branch:ref:main", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	job := inst.StockJob(base, "http://registry.invalid/", jobEgressAdmin,
		`echo "setup_script: running as $(id -un) (uid $(id -u))"`,
		// What a setup_script does with an ID token (a Vault login, say), short of the login.
		`echo "id_tokens: GITLAB_OIDC_TOKEN sha256 $(printf %s "$GITLAB_OIDC_TOKEN" | sha256sum | cut -c1-64)"`,
		`node -e 'const claims = JSON.parse(Buffer.from(process.env.GITLAB_OIDC_TOKEN.split(".")[1], "base64url")); console.log("id_tokens: GITLAB_OIDC_TOKEN for " + claims.aud)'`)
	job.Image.Name = hardenedImage
	job.Cache[0].Key = key
	job.Variables = append(job.Variables, fakegitlab.Variable{Key: "GITLAB_OIDC_TOKEN", Value: idToken, Masked: true})

	records := records.Namespace(t, c.Admin, namespace)
	wrapped := wrapExecutor(t, c, wrapping{holdCleanup: true, captureOutput: true})
	var runnerLog func() string
	var pod string
	res := runDuoJobWith(t, wrapped.Definition, inst, job, func(proc *runner.Process) {
		runnerLog = proc.Log
		wrapped.WaitCleanupHeld(t, proc)
		pod = jobPod(t, c, job)
		recordContainerLogs(t, c, records, pod)
		wrapped.ReleaseCleanup()
	})
	trace := res.Trace
	mustContainInOrder(t, trace,
		"Sandbox ready: pool "+hardenedPool,
		"Isolation: this flow runs under gVisor (RuntimeClass gvisor), not SRT, fenced by its NetworkPolicy and the egress proxy of pool "+hardenedPool+"; this image has no SRT",
		"Network policy: agent-config.yml's network_policy configures SRT and is not applied here",
		"Fetching changes with git depth set to 1",
		"setup_script: running as duo-runner (uid 1001)",
		"id_tokens: GITLAB_OIDC_TOKEN sha256 "+sha256Hex(idToken),
		"id_tokens: GITLAB_OIDC_TOKEN for https://vault.example.com",
		"duo-cli already present, skipping installation",
		"Warning: srt is not installed or not in PATH, running command directly without sandbox",
		"duo: $HOME is writable: wrote /home/duo-runner/"+duoflow.RipgrepInHome,
		"duo: session "+strconv.FormatInt(job.ID, 10)+": connected (websocket)",
		"tests passed: welcome, farewell",
		"merge request !1",
		"Creating cache "+key,
		"Created cache",
	)
	mustContain(t, "trace", trace, "Egress of this job through the egress proxy of pool "+hardenedPool+": "+inst.Host+":80, "+inst.Host+":443 (until")
	// The cache went through the runner's helper baked into the pool's pods, not a copy.
	assertHelperBaked(t, job.ID, trace)
	if sessions := inst.Workflows.Sessions(strconv.FormatInt(job.ID, 10)); len(sessions) != 1 || !sessions[0].Finished {
		t.Errorf("workflow service sessions: %+v", sessions)
	}
	if keys := inst.Cache.Keys(); len(keys) != 1 || !strings.HasSuffix(keys[0], "/"+key) {
		t.Errorf("S3 cache objects %q, want one for %s", keys, key)
	}
	assertPushed(t, inst, duoflow.Branch(job.ID), base)
	c.WaitJobGone(t, job.ID)
	// Positive control: the capture is the executor's output before the runner masks anything.
	executorOutput := wrapped.Output(t)
	mustContain(t, "the executor's output", executorOutput, "Sandbox ready: pool "+hardenedPool, "id_tokens: GITLAB_OIDC_TOKEN sha256 "+sha256Hex(idToken))
	assertNotRecorded(t, c, records, job, pod, map[string]string{"id token": idToken, "id token's signature": idToken[strings.LastIndex(idToken, ".")+1:]},
		map[string]string{"executor output": executorOutput, "runner log": runnerLog(), "trace": trace})
	t.Logf("job %d: %s in %s (handed out -> final state)", job.ID, res.State, res.Duration())
}

// newFlowRunner is the setup of the tests of GitLab's flow images: a flow's GitLab instance,
// closed when the test ends, with the flow's project pushed; and a runner whose pools are
// flowPools, then the suite's own, with the runner's helper copied into job pods. It returns
// the instance, the runner and the project's commit.
func newFlowRunner(t testing.TB, flowPools ...localcluster.PoolConfig) (*duoflow.Instance, *clusterjobs.Runner, string) {
	t.Helper()
	helper, err := duoflow.HelperConfig()
	if err != nil {
		t.Fatal(err)
	}
	inst, err := duoflow.NewInstance()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	c := newRunner(t, clusterjobs.Connect(t), localcluster.Config{Pools: append(flowPools, localcluster.Pools(pool)...), Extra: helper})
	base, err := inst.CreateProject()
	if err != nil {
		t.Fatal(err)
	}
	return inst, c, base
}

// bothFlowPools are the pools of GitLab's two flow images, each serving its exact image only.
func bothFlowPools() []localcluster.PoolConfig {
	return []localcluster.PoolConfig{
		{Name: flowPool, Images: []string{flowImage}, EgressProxy: flowEgressAdmin, EgressInstance: true},
		{Name: hardenedPool, Images: []string{hardenedImage}, EgressProxy: flowEgressAdmin, EgressInstance: true},
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// recordContainerLogs adds the log of every container of the job's pod to records.
func recordContainerLogs(t *testing.T, c *clusterjobs.Runner, records *records.Recorder, pod string) {
	t.Helper()
	ctx := context.Background()
	obj, err := c.Admin.Kube.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, container := range append(obj.Spec.InitContainers, obj.Spec.Containers...) {
		log, err := c.Admin.Kube.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container.Name}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("the log of container %s of pod %s: %v", container.Name, pod, err)
		}
		records.Add("container log "+pod+"/"+container.Name, string(log))
	}
}

// assertNotRecorded stops the recording once it has seen the job's claim and pod deleted, adds
// the namespace's events and the texts given, and fails for every secret that any of them
// holds. The job's claim, its pod's versions and its container logs must have been recorded:
// a recording that missed them proves nothing.
func assertNotRecorded(t *testing.T, c *clusterjobs.Runner, records *records.Recorder, job fakegitlab.Job, pod string, secrets, texts map[string]string) {
	t.Helper()
	claim := "claim " + kube.ClaimName(job.Token, c.Name, job.ID)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	records.WaitDeleted(ctx, t, claim, "pod "+pod)
	records.Stop()
	events, err := c.Admin.Kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	records.Add("events", events)
	for what, text := range texts {
		records.Add(what, text)
	}
	for what, secret := range secrets {
		if found := records.Containing(secret); len(found) > 0 {
			t.Errorf("the %s appears in %s", what, strings.Join(found, ", "))
		}
	}
	n, versions := records.Count()
	t.Logf("searched %d records (%d versions, %d events) for %d secrets", n, versions, len(events.Items), len(secrets))
}

// mustContainInOrder checks that each of wants appears in text after the previous one.
func mustContainInOrder(t *testing.T, text string, wants ...string) {
	t.Helper()
	rest := text
	for _, want := range wants {
		i := strings.Index(rest, want)
		if i < 0 {
			if strings.Contains(text, want) {
				t.Fatalf("%q appears, but not after the previous step; trace:\n%s", want, text)
			}
			t.Fatalf("%q does not appear; trace:\n%s", want, text)
		}
		rest = rest[i+len(want):]
	}
}
