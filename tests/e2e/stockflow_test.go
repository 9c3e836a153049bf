//go:build e2e

package e2e

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/clustertest"
	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// the duo-flow pools of the chart's values-duo-flow.yaml, as deploy/local/values.yaml has them on the local cluster, serving the stand-ins of
// GitLab's flow images (tests/cluster/images-duo.sh) through the egress proxy.
const (
	flowPool       = "duo-flow"
	flowImages     = "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image:*"
	hardenedPool   = "duo-flow-hardened"
	hardenedImages = "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image-hardened:*"
	hardenedImage  = "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image-hardened:v0.0.7"
	// flowEgressAdmin is the proxy of these pools: deploy/local's (tests/cluster/egress-proxy.sh).
	flowEgressAdmin = egressAdmin
)

// TestStockDuoFlow runs the stock flow's shape through gitlab-runner 17.9: a job with no image,
// served by the pool of GitLab's default image, whose egress is what the executor derives from
// the job (the instance of CI_SERVER_URL) plus the pool's npm registry, through the egress
// proxy. In order: setup_script as the image's user (root); the duo CLI installed from the npm
// stand-in; the repository cloned; SRT probed and falling back (gVisor and the fence are the
// sandbox, as the job log says); a WebSocket session with the workflow service through the
// instance; edit, test, commit, push; a merge request with CI_JOB_TOKEN; and a destination
// nothing allows, refused and named in the job log.
func TestStockDuoFlow(t *testing.T) {
	helper, err := duoflow.HelperConfig()
	if err != nil {
		t.Fatal(err)
	}
	inst, err := duoflow.NewInstance()
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	npm, err := duoflow.NewNPMRegistry()
	if err != nil {
		t.Fatal(err)
	}
	defer npm.Close()
	// The instance is granted from the job itself; only the npm registry is the pool's.
	pools := append([]localcluster.PoolConfig{
		{Name: flowPool, Images: []string{flowImages}, EgressProxy: flowEgressAdmin, EgressInstance: true, EgressAllow: []string{npm.Host + ":80"}},
	}, localcluster.Pools(pool)...)
	c := newRunner(t, clustertest.Connect(t), localcluster.Config{Pools: pools, Extra: helper})
	base, err := inst.CreateProject()
	if err != nil {
		t.Fatal(err)
	}
	job := inst.StockJob(base, npm.URL, flowEgressAdmin,
		`echo "setup_script: running as $(id -un) (uid $(id -u)) in $(pwd)"`,
		`npm config set --location=global registry "$`+duoflow.NPMRegistryVariable+`"`)
	res := runDuoJob(t, c, inst, job)
	trace := res.Trace

	mustContainInOrder(t, trace,
		"Sandbox ready: pool "+flowPool,
		"Isolation: this flow runs under gVisor (RuntimeClass gvisor), not SRT, fenced by its NetworkPolicy and the egress proxy of pool "+flowPool+"; SRT in this image cannot build its own sandbox",
		"Fetching changes with git depth set to 1",
		"setup_script: running as root (uid 0)",
		"added 1 package",
		"/usr/local/bin/duo",
		"0.0.0-standin",
		"Warning: SRT found but can't create sandbox (insufficient privileges), running command directly",
		"duo: session "+strconv.FormatInt(job.ID, 10)+": connected (websocket)",
		"tests passed: welcome, farewell",
		"merge request !1",
		"duo: session "+strconv.FormatInt(job.ID, 10)+": finished: 7 actions done",
		// The job cannot grant itself more egress: the proxy does not forward to its admin port.
		"self-grant: HTTP 403",
		// agent-config.yml's network_policy.allowed_domains reached SRT's settings only: the
		// proxy refuses the domain all the same.
		"outside: HTTP 403",
		"egress blocked: PUT "+strings.TrimPrefix(flowEgressAdmin, "http://")+" (not in the allowlist of pool "+flowPool+")",
		"egress blocked: GET "+duoflow.ProjectAllowedDomain+":80 (not in the allowlist of pool "+flowPool+")",
	)
	mustContain(t, "trace", trace, "Egress of this job through the egress proxy of pool "+flowPool+": "+inst.Host+":80, "+inst.Host+":443, "+npm.Host+":80")
	if n := npm.Downloads("@gitlab/duo-cli"); n != 1 {
		t.Errorf("@gitlab/duo-cli downloaded %d times, want 1", n)
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
	t.Logf("job %d: %s in %s (handed out -> final state)", job.ID, res.State, res.Duration())
}

// TestStockDuoFlowHardenedImage runs the same flow with agent-config.yml naming GitLab's
// hardened image: its pool (duo-flow-hardened) serves it; setup_script runs as the image's USER,
// UID 1001; the duo CLI is in the image, so the pool grants no npm registry and none is needed;
// there is no SRT; and the cache key is agent-config.yml's `key: {files, prefix}` as GitLab
// computes it.
func TestStockDuoFlowHardenedImage(t *testing.T) {
	helper, err := duoflow.HelperConfig()
	if err != nil {
		t.Fatal(err)
	}
	inst, err := duoflow.NewInstance()
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	pools := append([]localcluster.PoolConfig{
		{Name: hardenedPool, Images: []string{hardenedImages}, EgressProxy: flowEgressAdmin, EgressInstance: true},
	}, localcluster.Pools(pool)...)
	c := newRunner(t, clustertest.Connect(t), localcluster.Config{Pools: pools, Extra: helper})
	base, err := inst.CreateProject()
	if err != nil {
		t.Fatal(err)
	}
	key, err := inst.FilesCacheKey("duo-workflow", base, "package.json", ".npmrc")
	if err != nil {
		t.Fatal(err)
	}
	job := inst.StockJob(base, "http://registry.invalid/", flowEgressAdmin,
		`echo "setup_script: running as $(id -un) (uid $(id -u))"`)
	job.Image.Name = hardenedImage
	job.Cache[0].Key = key
	res := runDuoJob(t, c, inst, job)
	trace := res.Trace
	mustContainInOrder(t, trace,
		"Sandbox ready: pool "+hardenedPool,
		"Isolation: this flow runs under gVisor (RuntimeClass gvisor), not SRT, fenced by its NetworkPolicy and the egress proxy of pool "+hardenedPool+"; this image has no SRT",
		"Fetching changes with git depth set to 1",
		"setup_script: running as duo-runner (uid 1001)",
		"duo-cli already present, skipping installation",
		"Warning: srt is not installed or not in PATH, running command directly without sandbox",
		"duo: session "+strconv.FormatInt(job.ID, 10)+": connected (websocket)",
		"tests passed: welcome, farewell",
		"merge request !1",
		"Creating cache "+key,
		"Created cache",
	)
	mustContain(t, "trace", trace, "Egress of this job through the egress proxy of pool "+hardenedPool+": "+inst.Host+":80, "+inst.Host+":443 (until")
	if sessions := inst.Workflows.Sessions(strconv.FormatInt(job.ID, 10)); len(sessions) != 1 || !sessions[0].Finished {
		t.Errorf("workflow service sessions: %+v", sessions)
	}
	if keys := inst.Cache.Keys(); len(keys) != 1 || !strings.HasSuffix(keys[0], "/"+key) {
		t.Errorf("S3 cache objects %q, want one for %s", keys, key)
	}
	assertPushed(t, inst, duoflow.Branch(job.ID), base)
	c.WaitJobGone(t, job.ID)
	t.Logf("job %d: %s in %s (handed out -> final state)", job.ID, res.State, res.Duration())
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
