//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/duocli"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/quickstart"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// TestDocumentedInstall installs sandbox-executor by the commands of docs/install.md ("GitLab's
// default flow images, on an instance of your own": the namespace and token Secret, the
// instance's CA Secret, helm install of the packaged chart with values-duo-flow.yaml and a site
// values file, doctor), into a fresh namespace, replacing only the documented placeholders; the
// site file is tests/e2e/testdata/site-values.yaml, which has every key of the documented one
// (tests/chart checks it). The fake GitLab serves HTTPS with a CA of its own on the instance
// network (a private address), named by gitlab.url, gitlab.cidrs and gitlab.certsSecretName.
// The node is labelled and tainted as a GKE Sandbox pool while the chart installs, and the
// RuntimeClass's scheduling must get the warm pools' pods onto it. Jobs reach the network through
// the chart's egress proxy only. Through it: the stock flow's steps that work over HTTPS, a job
// that exits 3, a cancelled job, and a job under a drain of its node (which waits for it); then
// the docs' helm uninstall leaves nothing behind but what the docs say stays.
func TestDocumentedInstall(t *testing.T) {
	// Serial: it taints the only node NoSchedule, and later cordons it for a drain, so no other
	// test's pod can start meanwhile.
	c := clusterjobs.Connect(t)
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	suffix := strconv.Itoa(os.Getpid())
	gitlabNamespace := "sbx-install-gitlab-" + suffix
	ca, err := fakegitlab.NewCA("sandbox-executor e2e instance CA")
	if err != nil {
		t.Fatal(err)
	}
	inst, err := duoflow.NewHTTPSInstance(ca, chartinstall.InstanceName(gitlabNamespace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	base, err := inst.CreateProject()
	if err != nil {
		t.Fatal(err)
	}
	npm, err := duoflow.NewNPMRegistry()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(npm.Close)
	site, err := os.ReadFile(filepath.Join(root, "tests", "e2e", "testdata", "site-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	// The local cluster has one node: it is the gVisor pool and runs everything else, so the
	// site file lets the chart's own pods tolerate the taint too. The taint stays only until the
	// warm pools' pods are scheduled (the proof that the RuntimeClass's scheduling works): other
	// suites share this node and their pods do not tolerate it.
	untaint, unlabel, err := chartinstall.MarkGVisorNodes(ctx, c.Admin.Kube)
	if untaint != nil {
		t.Cleanup(func() {
			if err := unlabel(); err != nil {
				t.Errorf("restoring the node's labels: %v", err)
			}
		})
		t.Cleanup(func() {
			if err := untaint(); err != nil {
				t.Errorf("restoring the node's taints: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}

	q := readQuickstart(t, root, quickstart.DuoFlow)
	run, err := chartinstall.StartQuickstart(ctx, chartinstall.Options{Root: root, Env: c.Env, Kube: c.Admin.Kube,
		Namespace: "sbx-install-" + suffix, GitLabNamespace: gitlabNamespace,
		InstanceIP: inst.Host, RunnerToken: inst.GitLab.RunnerToken(), JobImage: flowImage, InstanceCA: ca.CertPEM},
		q, map[string]string{"site-values.yaml": string(site)})
	cleanupQuickstart(t, run)
	if err != nil {
		t.Fatal(err)
	}
	ns := run.Namespace
	install, uninstall := run.Split("helm", "uninstall")
	outputs, err := run.RunCommands(install)
	if err != nil {
		t.Fatalf("%v\nrunner pod log:\n%s", err, run.RunnerLog())
	}
	doctor := outputs[len(outputs)-1]
	t.Logf("release %s in %s (images %s); GitLab %s as %s; doctor:\n%s", run.Release.Release, ns, run.Tag, inst.GitLab.URL(), run.GitLabURL, doctor)

	// Scheduling: the flow pools' pods start on the tainted node, by the RuntimeClass alone.
	// Pool duo-default keeps values-duo-flow.yaml's example image (registry.example.com), which
	// is not on this cluster: its pods cannot start, as the docs say.
	waitPoolReady(t, c, ns, flowPool)
	pods, err := c.Admin.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	jobPods := 0
	for _, pod := range pods.Items {
		if pod.Spec.RuntimeClassName == nil || pod.Spec.NodeName == "" {
			continue
		}
		jobPods++
		if !slices.ContainsFunc(pod.Spec.Tolerations, func(tol corev1.Toleration) bool {
			return tol.ToleratesTaint(klog.Background(), &chartinstall.GVisorPool, false)
		}) {
			t.Errorf("job pod %s was scheduled without the RuntimeClass's toleration of %s: %+v", pod.Name, chartinstall.GVisorPool.ToString(), pod.Spec.Tolerations)
		}
	}
	if jobPods == 0 {
		t.Errorf("no job pod of %s was scheduled", ns)
	}
	if err := untaint(); err != nil {
		t.Fatal(err)
	}

	wait := jobWaiter(t, inst, run.Release)

	// The stock flow as far as it goes over HTTPS: setup_script; GitLab's duo CLI line, which
	// finds the CLI the image ships; a package from the npm stand-in (the site's mirror,
	// egressProxy.allow) through the chart's proxy, as a setup_script installs one; the clone over
	// HTTPS trusting the instance's CA as gitlab-runner hands it to the job; the agent's change
	// pushed and a merge request opened with the job token. The WebSocket session of `duo run`
	// is left out: the duo stand-in (tests/duocli, baked into the cluster's hardened image)
	// speaks plain HTTP and WebSocket only, so it cannot reach an HTTPS instance.
	job := inst.Job(base, flowImage)
	job.Cache, job.Artifacts = nil, nil // the chart configures no runner cache; the work is the branch
	job.Variables = append(job.Variables, fakegitlab.Variable{Key: duoflow.NPMRegistryVariable, Value: npm.URL, Public: true})
	job.Steps[0].Script = slices.Concat([]string{
		`echo "setup_script: running as $(id -un) (uid $(id -u))"`,
		`npm config set --location=global registry "$` + duoflow.NPMRegistryVariable + `"`,
		duoflow.InstallCLIUnlessPresent,
		`npm install --no-audit --no-fund --prefix /tmp/site-mirror @gitlab/duo-cli@` + duocli.Version,
		`echo "duo CLI $(duo --version)"`,
		`git log -1 --format="cloned %H from ${CI_REPOSITORY_URL%%://*}://${CI_SERVER_HOST}"`,
	}, duoflow.Change, duoflow.Commit, []string{
		`git remote set-url origin "https://${DUO_WORKFLOW_GIT_HTTP_USER}:${DUO_WORKFLOW_GIT_HTTP_PASSWORD}@${DUO_WORKFLOW_GIT_HTTP_BASE_URL#https://}/${CI_PROJECT_PATH}.git"`,
		`git -c http.sslCAInfo="$CI_SERVER_TLS_CA_FILE" push -q origin HEAD && echo "pushed over https"`,
		`curl -fsS --cacert "$CI_SERVER_TLS_CA_FILE" -H "JOB-TOKEN: $CI_JOB_TOKEN" -H "Content-Type: application/json" -o /dev/null -w "merge request: HTTP %{http_code}\n" ` +
			`-d "{\"source_branch\":\"duo/workflow-${CI_JOB_ID}\",\"target_branch\":\"main\",\"title\":\"Duo: ${DUO_WORKFLOW_GOAL}\"}" "${CI_API_V4_URL}/projects/${CI_PROJECT_ID}/merge_requests"`,
		// Nothing else: the proxy refuses what neither the instance grant nor the site allows.
		`if curl -sS --max-time 10 -o /dev/null -w "outside: HTTP %{http_code}\n" http://outside.sandbox.test/; then :; fi`,
	})
	inst.GitLab.Enqueue(job)
	res := wait(job.ID)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("flow job %d: %s (%s)\n%s\nrunner pod log:\n%s", job.ID, res.State, res.FailureReason, res.Trace, run.RunnerLog())
	}
	runtimeClass := ns + "-" + run.Fullname() + "-gvisor"
	mustContainInOrder(t, res.Trace,
		"Sandbox ready: pool "+flowPool,
		"runtime "+runtimeClass,
		"stages over pod network",
		"setup_script: running as root (uid 0)",
		"duo-cli already present, skipping installation",
		"added 1 package",
		"duo CLI 0.0.0-standin",
		"cloned "+base+" from https://"+inst.Host,
		"pushed over https",
		"merge request: HTTP 201",
		"outside: HTTP 403",
	)
	branch := duoflow.Branch(job.ID)
	assertPushed(t, inst, branch, base)
	if mrs := inst.GitLab.MergeRequests(); len(mrs) != 1 || mrs[0].JobID != job.ID || mrs[0].SourceBranch != branch {
		t.Errorf("merge requests: %+v, want one from %s by job %d", mrs, branch, job.ID)
	}
	if n := npm.Downloads("@gitlab/duo-cli"); n != 1 {
		t.Errorf("@gitlab/duo-cli downloaded %d times, want 1", n)
	}
	assertNoMaskedValues(t, job, res.Trace)
	waitClaimsGone(t, c, ns, kube.LabelJobID+"="+strconv.FormatInt(job.ID, 10))
	t.Logf("flow job %d: %s in %s", job.ID, res.State, res.Duration().Round(time.Millisecond))

	assertFailingJob(t, c, inst, ns, flowImage, wait)
	assertCanceledJob(t, c, inst, ns, flowImage, wait, run.RunnerLog)
	assertDrainWaitsForRunningJob(t, c, inst, run.Release, flowImage, wait)
	assertDrainBoundEndsJob(t, c, inst, run.Release, flowImage, wait)

	// The docs' helm uninstall: nothing of the release is left, and in the namespace only what
	// the docs say is the user's (the token and CA Secrets) or stays (the agent CA).
	if _, err := run.RunCommands(uninstall); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, c, run.Release)
	assertOnlyKept(t, c, ns, map[string][]string{
		"Secret":    {"gitlab-ca", "gitlab-runner-token", agentCA},
		"ConfigMap": {"kube-root-ca.crt", agentCA},
	})
}

// agentCA is the agent CA's Secret and ConfigMap (agentTLS.name), which uninstall leaves.
const agentCA = "sandbox-executor-agent-ca"

// TestQuickstartsRunAsWritten runs the quickstarts of docs/install.md on the local cluster as
// written, each into a fresh namespace, replacing only the documented placeholders (the
// namespace ci-sandbox, the token glrt-..., https://gitlab.example.com, the images'
// registry.example.com/sandbox-executor and tag v0.1.0, the job image registry.example.com/duo/ci:bookworm
// and its repository): a value renamed in the chart, an object renamed or a step missing fails
// it. The chart quickstart registers with the fake GitLab (HTTP, by a cluster DNS name) and runs
// a job; the VM quickstart installs without the runner and its ServiceAccount token must
// authenticate as that ServiceAccount. The README's quickstart runs in tests/chart only
// (rendered): it leaves the images' tag at the chart's appVersion, v0.1.0, and make images tags
// this cluster's images by git describe instead.
func TestQuickstartsRunAsWritten(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{quickstart.Chart, quickstart.VM} {
		t.Run(name, func(t *testing.T) {
			inst, _ := duoInstance(t)
			suffix := name + "-" + strconv.Itoa(os.Getpid())
			run, err := chartinstall.StartQuickstart(ctx, chartinstall.Options{Root: root, Env: c.Env, Kube: c.Admin.Kube,
				Namespace: "sbx-qs-" + suffix, GitLabNamespace: "sbx-qs-gitlab-" + suffix,
				InstanceIP: inst.Host, RunnerToken: inst.GitLab.RunnerToken(), JobImage: ciImage}, readQuickstart(t, root, name), nil)
			cleanupQuickstart(t, run)
			if err != nil {
				t.Fatal(err)
			}
			install, uninstall := run.Split("helm", "uninstall")
			outputs, err := run.RunCommands(install)
			if err != nil {
				t.Fatalf("%v\nrunner pod log:\n%s", err, run.RunnerLog())
			}
			switch name {
			case quickstart.Chart:
				// The job needs no network: my-values.yaml's proxied template reaches only the
				// proxy, which admits public addresses, and this instance is on a private one.
				job := inst.GitLab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none", Script: []string{"echo quickstart job ran"}})
				inst.GitLab.Enqueue(job)
				ctx, cancel := context.WithTimeout(ctx, inClusterTimeout)
				res, err := inst.GitLab.Wait(ctx, job.ID)
				cancel()
				if err != nil || res.State != fakegitlab.StateSuccess {
					t.Fatalf("job %d: %s %v\n%s\nrunner pod log:\n%s", job.ID, res.State, err, res.Trace, run.RunnerLog())
				}
				mustContain(t, "job trace", res.Trace, "Sandbox ready: pool duo-default", "quickstart job ran")
			case quickstart.VM:
				// The token alone, as the runner host's kubeconfig holds it: not the admin's
				// client certificate, which kubectl would send as well.
				cfg := rest.AnonymousClientConfig(clusterjobs.RESTConfig(t, c.Env.AdminKubeconfig()))
				cfg.BearerToken = strings.TrimSpace(outputs[len(outputs)-1])
				who, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
				if want := "system:serviceaccount:" + run.Namespace + ":" + run.Fullname(); err != nil || who.Status.UserInfo.Username != want {
					t.Errorf("the quickstart's token authenticates as %+v (%v), want %s", who, err, want)
				}
			}
			if _, err := run.RunCommands(uninstall); err != nil {
				t.Fatal(err)
			}
			assertNothingLeft(t, c, run.Release)
		})
	}
}

// readQuickstart reads quickstart name of the docs.
func readQuickstart(t *testing.T, root, name string) *quickstart.Quickstart {
	t.Helper()
	qs, err := quickstart.Read(root, quickstart.Docs...)
	if err != nil {
		t.Fatal(err)
	}
	q := qs[name]
	if q == nil {
		t.Fatalf("the docs have no quickstart %q", name)
	}
	return q
}

// cleanupQuickstart uninstalls what a quickstart run installed (if its own uninstall did not
// run) and deletes its namespaces.
func cleanupQuickstart(t *testing.T, run *chartinstall.Quickstart) {
	if run == nil {
		return
	}
	t.Cleanup(func() {
		if !run.Uninstalled() {
			_ = run.Uninstall()
		}
		if err := run.Close(); err != nil {
			t.Error(err)
		}
	})
}

// waitPoolReady waits until pool of ns has a Ready sandbox.
func waitPoolReady(t *testing.T, c *clusterjobs.Cluster, ns, pool string) {
	t.Helper()
	deadline := time.Now().Add(inClusterTimeout)
	for {
		p, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(ns).Get(context.Background(), pool, metav1.GetOptions{})
		if err == nil && p.Status.ReadyReplicas > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s/%s has no Ready sandbox after %s (%v)", ns, pool, inClusterTimeout, err)
		}
		time.Sleep(2 * time.Second)
	}
}

// assertOnlyKept: the namespace holds exactly the named objects of each kind.
func assertOnlyKept(t *testing.T, c *clusterjobs.Cluster, ns string, want map[string][]string) {
	t.Helper()
	ctx := context.Background()
	secrets, err := c.Admin.Kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	configMaps, err := c.Admin.Kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, s := range secrets.Items {
		got["Secret"] = append(got["Secret"], s.Name)
	}
	for _, m := range configMaps.Items {
		got["ConfigMap"] = append(got["ConfigMap"], m.Name)
	}
	for kind, names := range want {
		slices.Sort(names)
		slices.Sort(got[kind])
		if !slices.Equal(got[kind], names) {
			t.Errorf("%ss left in %s after helm uninstall: %q, want %q", kind, ns, got[kind], names)
		}
	}
}
