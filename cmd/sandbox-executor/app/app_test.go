package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/cmd/sandbox-executor/app"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

func TestMain(m *testing.M) { fakecluster.Main(m) }

// testToken is the harness's job token (CI_JOB_TOKEN): the claim's name is keyed with it.
const testToken = "glcbt-64_s3cr3tJobT0ken"

// secrets are job variables as GitLab sends them: plain text in CUSTOM_ENV_*.
var secrets = map[string]string{
	"CUSTOM_ENV_CI_JOB_TOKEN":                   "glcbt-64_s3cr3tJobT0ken",
	"CUSTOM_ENV_DUO_WORKFLOW_SERVICE_TOKEN":     "duo-wf-t0ken-abcdef123456",
	"CUSTOM_ENV_DUO_WORKFLOW_GIT_HTTP_PASSWORD": "gitpassw0rd-98765",
	"CUSTOM_ENV_GITLAB_TOKEN":                   "glpat-XXXXsecretXXXX",
	"CUSTOM_ENV_GITLAB_OAUTH_TOKEN":             "oauth-secret-value-42",
}

// harness runs the CLI like the runner does, against the fake cluster and a local agent.
type harness struct {
	t       testing.TB
	cluster *fakecluster.Cluster
	local   *fakecluster.Local
	env     map[string]string
	tmp     string
}

func newHarness(t testing.TB, image string) *harness { return newHarnessWithConfig(t, image, "") }

// coldConfig cold-starts tools/* images (unknown_image = "cold").
const coldConfig = `unknown_image = "cold"
cold_template = "` + fakecluster.Template + `"
cold_images = ["tools/*:*"]`

// newHarnessWithConfig adds extra to the top-level keys of the executor's config.
func newHarnessWithConfig(t testing.TB, image, extra string) *harness {
	t.Helper()
	return newHarnessWithPool(t, image, extra, `images = ["ci:bookworm"]`)
}

// newHarnessWithPool also gives the pool poolKeys instead of its image, the one its pods run.
func newHarnessWithPool(t testing.TB, image, extra, poolKeys string) *harness {
	t.Helper()
	tmp := t.TempDir()
	agentBin := filepath.Join(tmp, "agent-binary")
	os.WriteFile(agentBin, []byte("\x7fELF stand-in"), 0o755)
	cfgPath := filepath.Join(tmp, "config.toml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`namespace = %q
runner_name = "test-runner"
default_pool = %q
agent_binary = %q
%s
[[pool]]
name = %q
%s
`, fakecluster.Namespace, fakecluster.Pool, agentBin, extra, fakecluster.Pool, poolKeys)), 0o600)
	job := map[string]any{
		"id": 777, "token": testToken,
		"job_info":    map[string]any{"project_id": 12},
		"runner_info": map[string]any{"timeout": 600},
		"image":       map[string]any{"name": image},
		"variables":   []map[string]any{{"key": "CI_PIPELINE_ID", "value": "34"}, {"key": "CI_JOB_TOKEN", "value": "glcbt-64_s3cr3tJobT0ken"}},
	}
	data, _ := json.Marshal(job)
	jobFile := filepath.Join(tmp, "response.json")
	os.WriteFile(jobFile, data, 0o600)
	env := map[string]string{
		config.EnvVar:              cfgPath,
		"JOB_RESPONSE_FILE":        jobFile,
		"BUILD_EXIT_CODE_FILE":     filepath.Join(tmp, "exit-code"),
		"BUILD_FAILURE_EXIT_CODE":  "1",
		"SYSTEM_FAILURE_EXIT_CODE": "2",
		"TMPDIR":                   tmp,
	}
	for k, v := range secrets {
		env[k] = v
	}
	return &harness{t: t, cluster: fakecluster.NewCluster(t), local: fakecluster.NewLocal(t), env: env, tmp: tmp}
}

// run invokes the binary's command line and returns exit code, stdout and stderr.
func (h *harness) run(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := app.RunWith(context.Background(), append([]string{"sandbox-executor"}, args...), &stdout, &stderr,
		func(k string) string { return h.env[k] }, h.deps())
	return code, stdout.String(), stderr.String()
}

// deps connects to the fake cluster and runs commands through the local agent.
func (h *harness) deps() app.Deps {
	return app.Deps{
		Clients: func(*config.Config) (*kube.Clients, error) {
			c := *h.cluster.Clients
			c.Exec = h.local
			return &c, nil
		},
		Environ: func() []string {
			var out []string
			for k, v := range h.env {
				out = append(out, k+"="+v)
			}
			return out
		},
	}
}

func (h *harness) script(body string) string {
	p := filepath.Join(h.tmp, fmt.Sprintf("script-%d", len(body)))
	os.WriteFile(p, []byte(body), 0o700)
	return p
}

func TestJobLifecycleAndExitCodes(t *testing.T) {
	h := newHarness(t, "ci:bookworm")
	var all strings.Builder
	step := func(want int, args ...string) string {
		code, out, errOut := h.run(args...)
		all.WriteString(out + errOut)
		if code != want {
			t.Fatalf("%v: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, out, errOut)
		}
		return out + errOut
	}

	out := step(0, "config")
	var cfgOut map[string]any
	if err := json.Unmarshal([]byte(out), &cfgOut); err != nil || cfgOut["builds_dir"] != "/builds" || cfgOut["hostname"] != kube.ClaimName(testToken, "test-runner", 777) {
		t.Fatalf("config output %q: %v", out, err)
	}
	log := step(0, "prepare")
	for _, want := range []string{"pool duo-default (warm start)", "runtime gvisor", "kernel 4.19.0-gvisor"} {
		if !strings.Contains(log, want) {
			t.Errorf("prepare log lacks %q:\n%s", want, log)
		}
	}
	if out := step(0, "run", h.script("echo from the pod\n"), "build_script"); !strings.Contains(out, "from the pod") {
		t.Errorf("run output = %q", out)
	}
	step(1, "run", h.script("echo failing; exit 42\n"), "after_script")
	if code, _ := os.ReadFile(h.env["BUILD_EXIT_CODE_FILE"]); strings.TrimSpace(string(code)) != "42" {
		t.Errorf("BUILD_EXIT_CODE_FILE = %q, want 42", code)
	}
	// The summary closes the job log, once: after the runner's last stage, not before.
	if strings.Contains(all.String(), "Sandbox summary") {
		t.Errorf("summary printed before the last stage:\n%s", all.String())
	}
	summary := step(0, "run", h.script("true\n"), "cleanup_file_variables")
	if !regexp.MustCompile(`Sandbox summary: pool duo-default \(warm start\), claimed in \d+ ms; executor overhead \d+ ms \(prepare \d+ ms, 3 stages \d+ ms\); scripts \d+ ms`).MatchString(summary) {
		t.Errorf("last stage's log lacks the summary line:\n%s", summary)
	}

	claim, err := h.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace).Get(context.Background(), kube.ClaimName(testToken, "test-runner", 777), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claimJSON, _ := json.Marshal(claim)
	step(0, "cleanup")
	step(0, "cleanup") // idempotent
	if _, err := h.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace).Get(context.Background(), claim.Name, metav1.GetOptions{}); err == nil {
		t.Error("claim still exists after cleanup")
	}

	// Nothing from the job's environment leaks into our output, the claim or exec argv.
	var argv strings.Builder
	for _, c := range h.local.Commands() {
		argv.WriteString(strings.Join(c, " "))
	}
	for name, value := range secrets {
		for where, text := range map[string]string{"our output": all.String(), "the claim": string(claimJSON), "exec argv": argv.String()} {
			if strings.Contains(text, value) {
				t.Errorf("%s value appears in %s", name, where)
			}
		}
	}
}

func TestPermanentErrorsAreBuildFailuresWithOneLine(t *testing.T) {
	for _, tc := range []struct {
		name, image string
		edit        func(h *harness)
		want        string
	}{
		{"image not allowed", "evil/miner:latest", nil, `image not allowed: "evil/miner:latest": no pool runs it (pool duo-default serves ci:bookworm)`},
		{"bad config", "ci:1", func(h *harness) { os.WriteFile(h.env[config.EnvVar], []byte("namespace = 3\n"), 0o600) }, "namespace"},
		{"missing config", "ci:1", func(h *harness) { h.env[config.EnvVar] = "/nonexistent/config.toml" }, "config /nonexistent/config.toml: file not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.image)
			if tc.edit != nil {
				tc.edit(h)
			}
			code, out, errOut := h.run("prepare")
			if code != 1 {
				t.Errorf("exit %d, want BUILD_FAILURE (1)", code)
			}
			if !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 1 || out != "" {
				t.Errorf("stderr = %q, want one line containing %q", errOut, tc.want)
			}
		})
	}
}

func TestRunWithoutPrepareIsSystemFailure(t *testing.T) {
	h := newHarness(t, "ci:1")
	code, _, errOut := h.run("run", h.script("true\n"), "build_script")
	if code != 2 || !strings.Contains(errOut, "is gone") {
		t.Errorf("exit %d, stderr %q: want SYSTEM_FAILURE saying the claim is gone", code, errOut)
	}
}

func TestHelpListsStages(t *testing.T) {
	h := newHarness(t, "")
	code, out, _ := h.run("--help")
	for _, cmd := range []string{"config", "prepare", "run", "cleanup"} {
		if !strings.Contains(out, cmd) {
			t.Errorf("--help lacks %s", cmd)
		}
	}
	if code != 0 {
		t.Errorf("--help exit %d", code)
	}
}

func TestGCReapsOnlyThisRunnersExpiredClaims(t *testing.T) {
	h := newHarness(t, "ci:1")
	ctx := context.Background()
	claims := h.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace)
	mk := func(name, runner string, shutdown time.Time) {
		t.Helper()
		ts := metav1.NewTime(shutdown)
		_, err := claims.Create(ctx, &extv1beta1.SandboxClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fakecluster.Namespace, Labels: map[string]string{
				kube.LabelManagedBy: kube.ManagedByValue, kube.LabelRunner: runner, kube.LabelJobID: name}},
			Spec: extv1beta1.SandboxClaimSpec{WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: fakecluster.Pool},
				Lifecycle: &extv1beta1.Lifecycle{ShutdownTime: &ts, ShutdownPolicy: extv1beta1.ShutdownPolicyDelete}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	mk("expired", "test-runner", time.Now().Add(-time.Hour))
	mk("running", "test-runner", time.Now().Add(time.Hour))
	mk("other-runner", "someone-else", time.Now().Add(-time.Hour))

	exists := func(name string) bool {
		_, err := claims.Get(ctx, name, metav1.GetOptions{})
		return err == nil
	}
	code, out, errOut := h.run("gc")
	if code != 0 || !strings.Contains(out, "would delete sandbox-executor/expired") || strings.Contains(out, "running") || strings.Contains(out, "other-runner") {
		t.Fatalf("dry run: exit %d\n%s%s", code, out, errOut)
	}
	if !exists("expired") {
		t.Fatal("a dry run deleted a claim")
	}
	if code, out, errOut := h.run("gc", "--delete"); code != 0 || !strings.Contains(out, "deleted sandbox-executor/expired") {
		t.Fatalf("gc --delete: exit %d\n%s%s", code, out, errOut)
	}
	if exists("expired") || !exists("running") || !exists("other-runner") {
		t.Errorf("after gc --delete: expired=%v running=%v other-runner=%v; want only expired gone", exists("expired"), exists("running"), exists("other-runner"))
	}
}

// unknown_image = "cold": an image no pool serves but cold_images allows runs in a Sandbox made
// from cold_template; the job log says so; cleanup deletes the Sandbox, with or without prepare's
// state; an image allowed by neither list is a build failure naming both.
func TestColdStartJobLifecycle(t *testing.T) {
	h := newHarnessWithConfig(t, "tools/jq:1", coldConfig)
	name := kube.ClaimName(testToken, "test-runner", 777)
	sandboxes := h.cluster.Sandboxes.AgentsV1beta1().Sandboxes(fakecluster.Namespace)
	exists := func() bool {
		_, err := sandboxes.Get(context.Background(), name, metav1.GetOptions{})
		return err == nil
	}
	step := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := h.run(args...)
		if code != want {
			t.Fatalf("%v: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, out, errOut)
		}
		return out + errOut
	}
	log := step(0, "prepare")
	for _, want := range []string{
		`Image tools/jq:1 is served by no warm pool: cold start of a sandbox from template duo-gvisor (unknown_image = "cold")`,
		"Sandbox ready: template duo-gvisor (cold start: no warm pool serves the image), pod sandbox-executor/" + name, "runtime gvisor",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("prepare log lacks %q:\n%s", want, log)
		}
	}
	sbx, err := sandboxes.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sbxJSON, _ := json.Marshal(sbx)
	for key, value := range secrets {
		if strings.Contains(string(sbxJSON), value) {
			t.Errorf("%s value appears in the Sandbox", key)
		}
	}
	if out := step(0, "run", h.script("echo from the cold pod\n"), "build_script"); !strings.Contains(out, "from the cold pod") {
		t.Errorf("run output = %q", out)
	}
	step(0, "cleanup")
	step(0, "cleanup") // idempotent
	if exists() {
		t.Error("Sandbox still exists after cleanup")
	}
	if claims, _ := h.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace).List(context.Background(), metav1.ListOptions{}); len(claims.Items) != 0 {
		t.Errorf("a cold start made %d claims", len(claims.Items))
	}

	// No state file (prepare's TMPDIR gone, or an old runner): run and cleanup find it by name.
	step(0, "prepare")
	delete(h.env, "TMPDIR")
	if out := step(0, "run", h.script("echo without state\n"), "build_script"); !strings.Contains(out, "without state") {
		t.Errorf("run without state: %q", out)
	}
	step(0, "cleanup")
	if exists() {
		t.Error("Sandbox still exists after a cleanup without prepare's state")
	}

	refused := newHarnessWithConfig(t, "evil/tools:1", coldConfig)
	code, out, errOut := refused.run("prepare")
	if code != 1 || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") > 0 ||
		!strings.Contains(errOut, `image not allowed: "evil/tools:1": no pool runs it (pool `+fakecluster.Pool+` serves ci:bookworm); cold starts (unknown_image = "cold") allow tools/*:*`) {
		t.Errorf("an image in neither list: exit %d, stderr %q; want BUILD_FAILURE (1) with one line naming both lists", code, errOut)
	}
	if list, _ := refused.cluster.Sandboxes.AgentsV1beta1().Sandboxes(fakecluster.Namespace).List(context.Background(), metav1.ListOptions{}); len(list.Items) != 0 {
		t.Errorf("a refused image got %d Sandboxes", len(list.Items))
	}
}

func TestGCReapsOnlyThisRunnersExpiredColdStarts(t *testing.T) {
	h := newHarnessWithConfig(t, "ci:1", coldConfig)
	ctx := context.Background()
	sandboxes := h.cluster.Sandboxes.AgentsV1beta1().Sandboxes(fakecluster.Namespace)
	isController := true
	mk := func(name, runner, owner string, shutdown time.Time) {
		t.Helper()
		ts := metav1.NewTime(shutdown)
		sbx := &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fakecluster.Namespace,
			Labels:          map[string]string{kube.LabelManagedBy: kube.ManagedByValue, kube.LabelRunner: runner, kube.LabelJobID: name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "extensions.agents.x-k8s.io/v1beta1", Kind: owner, Name: "x", Controller: &isController}}}}
		sbx.Spec.ShutdownTime = &ts
		if _, err := sandboxes.Create(ctx, sbx, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("expired", "test-runner", "SandboxTemplate", time.Now().Add(-time.Hour))
	mk("running", "test-runner", "SandboxTemplate", time.Now().Add(time.Hour))
	mk("other-runner", "someone-else", "SandboxTemplate", time.Now().Add(-time.Hour))
	mk("a-claims", "test-runner", "SandboxClaim", time.Now().Add(-time.Hour)) // not ours to delete: its claim's
	exists := func(name string) bool {
		_, err := sandboxes.Get(ctx, name, metav1.GetOptions{})
		return err == nil
	}
	code, out, errOut := h.run("gc", "--delete")
	if code != 0 || !strings.Contains(out, "deleted sandbox-executor/expired (cold-started Sandbox, job expired") || !strings.Contains(out, "1 of 2 claims and cold-started Sandboxes") {
		t.Fatalf("gc --delete: exit %d\n%s%s", code, out, errOut)
	}
	if exists("expired") || !exists("running") || !exists("other-runner") || !exists("a-claims") {
		t.Errorf("after gc --delete: expired=%v running=%v other-runner=%v a-claims=%v; want only expired gone",
			exists("expired"), exists("running"), exists("other-runner"), exists("a-claims"))
	}
}

// withToken gives the harness's job another token: the same job ID from another GitLab instance.
func (h *harness) withToken(token string) {
	h.t.Helper()
	data, err := os.ReadFile(h.env["JOB_RESPONSE_FILE"])
	if err != nil {
		h.t.Fatal(err)
	}
	var job map[string]any
	if err := json.Unmarshal(data, &job); err != nil {
		h.t.Fatal(err)
	}
	job["token"] = token
	data, _ = json.Marshal(job)
	if err := os.WriteFile(h.env["JOB_RESPONSE_FILE"], data, 0o600); err != nil {
		h.t.Fatal(err)
	}
}

// A second job with the runner name and job ID of a running one (another GitLab instance) has
// another token, so its claim has another name: it gets a sandbox of its own and runs there, and
// never touches the first job's claim; the job that made that claim still adopts it on a retried
// prepare. (Before the name was keyed with the token, the second job met the first job's claim
// and was refused.)
func TestAnotherJobWithTheSameIDGetsItsOwnSandbox(t *testing.T) {
	first := newHarness(t, "ci:bookworm")
	second := newHarness(t, "ci:bookworm")
	second.cluster, second.local = first.cluster, first.local
	const otherToken = "glcbt-64_anotherInstancesT0ken"
	second.withToken(otherToken)
	claims := first.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace)
	name, otherName := kube.ClaimName(testToken, "test-runner", 777), kube.ClaimName(otherToken, "test-runner", 777)
	if name == otherName {
		t.Fatalf("two tokens give one claim name %s", name)
	}
	if code, out, errOut := first.run("prepare"); code != 0 {
		t.Fatalf("first prepare: exit %d\n%s%s", code, out, errOut)
	}
	before, err := claims.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if code, out, errOut := second.run("prepare"); code != 0 {
		t.Fatalf("second prepare: exit %d, want its own sandbox\n%s%s", code, out, errOut)
	}
	first.cluster.WaitClaimStatus(t, name)
	first.cluster.WaitClaimStatus(t, otherName)
	made, err := claims.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || made.UID != before.UID {
		t.Fatalf("the first job's claim after the second prepare: %v (uid %s, was %s)", err, made.UID, before.UID)
	}
	own, err := claims.Get(context.Background(), otherName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the second job's claim %s: %v", otherName, err)
	}
	if own.Annotations[kube.AnnotationJobBinding] != kube.JobBinding(otherToken, fakecluster.Namespace, otherName) {
		t.Errorf("the second job's claim carries binding %q, want its own", own.Annotations[kube.AnnotationJobBinding])
	}
	if own.Status.SandboxStatus.Name == "" || own.Status.SandboxStatus.Name == made.Status.SandboxStatus.Name {
		t.Errorf("the second job's sandbox is %q, the first job's %q: want one of its own", own.Status.SandboxStatus.Name, made.Status.SandboxStatus.Name)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	if code, out, errOut := second.run("run", second.script("touch "+marker+"\n"), "build_script"); code != 0 {
		t.Errorf("second run: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the second job's script did not run: %v", err)
	}
	if code, out, errOut := second.run("cleanup"); code != 0 {
		t.Errorf("second cleanup: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := claims.Get(context.Background(), otherName, metav1.GetOptions{}); err == nil {
		t.Error("the second job's cleanup left its claim")
	}
	if kept, err := claims.Get(context.Background(), name, metav1.GetOptions{}); err != nil || kept.UID != made.UID || kept.DeletionTimestamp != nil {
		t.Fatalf("the second job touched the first job's claim: %v", err)
	}

	for _, stage := range [][]string{{"prepare"}, {"run", first.script("true\n"), "build_script"}, {"cleanup"}} {
		if code, out, errOut := first.run(stage...); code != 0 {
			t.Fatalf("first job's %s (a retried prepare adopts its claim): exit %d\n%s%s", stage[0], code, out, errOut)
		}
	}
	if _, err := claims.Get(context.Background(), name, metav1.GetOptions{}); err == nil {
		t.Error("the first job's cleanup left its claim")
	}
}

// loopback is a loopback address that accepts connections (accept) or refuses them.
func loopback(t *testing.T, accept bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !accept {
		ln.Close()
		return ln.Addr().String()
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for conn, err := ln.Accept(); err == nil; conn, err = ln.Accept() {
			conn.Close()
		}
	}()
	return ln.Addr().String()
}

// Prepare asks the pod's agent for a fresh fence check before any script runs (the local agent
// reads the fence from this process's environment, as the pod's from the container's). A fence
// that does not hold is a system failure (the runner retries) and the claim is released, so the
// retry gets another sandbox; a pod without a fence check is refused only with require_fence.
// With drained_pool = "cold" the pool is read alongside the claim, not before it: a pool that
// does not exist still fails the job with the pool's own one line, and leaves no claim behind.
func TestPrepareWithAMissingPoolLeavesNoClaim(t *testing.T) {
	h := newHarness(t, "ci:bookworm")
	if err := h.cluster.Extensions.ExtensionsV1beta1().SandboxWarmPools(fakecluster.Namespace).Delete(context.Background(), fakecluster.Pool, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := h.run("prepare")
	want := `SandboxWarmPool "duo-default" not found in namespace "sandbox-executor"`
	if code != 1 || !strings.Contains(errOut, want) {
		t.Fatalf("prepare: exit %d, stderr %q; want BUILD_FAILURE (1) and %q", code, errOut, want)
	}
	claims, err := h.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(claims.Items) != 0 {
		t.Errorf("claims left behind: %d (%v), want none", len(claims.Items), err)
	}
}

func TestPrepareFailsClosedOnTheFence(t *testing.T) {
	open, closed := loopback(t, true), loopback(t, false)
	for _, tc := range []struct {
		name, deny, allow, extra string
		code                     int
		want                     string
	}{
		{"holds", closed, open, "", 0, "Sandbox ready"},
		{"canary reachable", open, open, "", 2, "the egress fence of pod " + fakecluster.Namespace + "/duo-default-abcde does not hold: denied canary " + open + " is reachable"},
		{"instance unreachable", closed, closed, "", 2, "allowed " + closed + " is not reachable (refused)"},
		{"not configured", "", "", "", 0, "Sandbox ready"},
		{"not configured, required", "", "", "require_fence = true", 1, "has no egress fence check and require_fence is set: give the SandboxTemplate of pool duo-default SANDBOX_EXECUTOR_FENCE_DENY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(wire.FenceDenyEnv, tc.deny)
			t.Setenv(wire.FenceAllowEnv, tc.allow)
			h := newHarnessWithConfig(t, "ci:bookworm", tc.extra)
			code, _, errOut := h.run("prepare")
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Fatalf("prepare: exit %d, stderr %q; want %d and %q", code, errOut, tc.code, tc.want)
			}
			_, err := h.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace).Get(context.Background(), kube.ClaimName(testToken, "test-runner", 777), metav1.GetOptions{})
			if released := err != nil; released != (code != 0) {
				t.Errorf("claim released: %t, want %t (a refused pod is released at once)", released, code != 0)
			}
			if code != 0 && !slices.ContainsFunc(strings.Split(errOut, "\n"), func(line string) bool {
				return strings.Contains(line, "ERROR: ") && strings.Contains(line, tc.want)
			}) {
				t.Errorf("the refusal is not one ERROR line:\n%s", errOut)
			}
		})
	}
}

// A job runs in the image it asked for. The fake pool's pods run ci:bookworm: a pool lists it
// exactly (any spelling the runtime resolves alike); another tag runs there only with
// serve_other_tags, and the job log then warns in one line with both images; a pool listing an
// image its pods do not run fails the job in one line and releases the claim; a tag no pool
// serves is refused before anything is claimed.
func TestJobRunsInTheImageItAskedFor(t *testing.T) {
	const warning = "WARNING: The job asked for image ci:trixie but runs in ci:bookworm, the image of pool duo-default (serve_other_tags = true)"
	for _, tc := range []struct {
		name, image, poolKeys string
		code                  int
		want                  string
		claimed               bool
	}{
		{"exact", "docker.io/library/ci:bookworm", `images = ["ci:bookworm"]`, 0, "Sandbox ready", true},
		{"another tag, served explicitly", "ci:trixie", "images = [\"ci:bookworm\"]\nserve_other_tags = true", 0, warning, true},
		{"another tag, refused", "ci:trixie", `images = ["ci:bookworm"]`, 1,
			`image not allowed: "ci:trixie": no pool runs it (pool duo-default serves ci:bookworm); remove image: from the job to run in default_pool duo-default`, false},
		{"a listed image the pool does not run", "ci:trixie", `images = ["ci:bookworm", "ci:trixie"]`, 1,
			"pool duo-default runs image ci:bookworm, not ci:trixie that the job asks for: list only the image its SandboxTemplate runs in its [[pool]] images", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWithPool(t, tc.image, "", tc.poolKeys)
			code, out, errOut := h.run("prepare")
			log := out + errOut
			if code != tc.code || !strings.Contains(log, tc.want) {
				t.Fatalf("prepare: exit %d, want %d and %q in\n%s", code, tc.code, tc.want, log)
			}
			if lines := slices.DeleteFunc(strings.Split(log, "\n"), func(line string) bool { return !strings.Contains(line, tc.want) }); len(lines) != 1 {
				t.Errorf("want one line with %q, got %q", tc.want, lines)
			}
			if tc.want != warning && strings.Contains(log, "serve_other_tags") {
				t.Errorf("a job in its own image, or refused, is not warned of another tag:\n%s", log)
			}
			_, err := h.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace).Get(context.Background(), kube.ClaimName(testToken, "test-runner", 777), metav1.GetOptions{})
			if claimed := err == nil; claimed != tc.claimed {
				t.Errorf("claim kept: %t, want %t (a refused job keeps no claim)", claimed, tc.claimed)
			}
		})
	}
}

// The job log says how the job got its sandbox from what happened to its claim, in the same
// words in prepare's "Sandbox ready" line and the closing summary, and never warns of a drained
// pool the outcome contradicts: a refill can turn a sandbox Ready between the pool check and
// the claim.
func TestJobLogSaysHowTheJobGotItsSandbox(t *testing.T) {
	for _, tc := range []struct {
		name   string
		extra  string
		launch kube.Launch
		// refill: the pool is drained at the check and gets a ready sandbox while prepare waits.
		refill bool
		origin string
	}{
		{"drained at the check, Ready by the claim", "", kube.LaunchWarm, false, `pool duo-default \(warm start\)`},
		{"adopted while booting", "", kube.LaunchWaited, false, `pool duo-default \(waited \d+ ms for a warm sandbox\)`},
		{"created for the job", "", kube.LaunchCold, false, `pool duo-default \(cold start: the pool had no sandbox to hand out\)`},
		{`drained_pool = "wait"`, `drained_pool = "wait"`, kube.LaunchWarm, true, `pool duo-default \(waited \d+ ms for a warm sandbox\)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWithConfig(t, "ci:bookworm", tc.extra)
			h.cluster.Launch = tc.launch
			h.cluster.SetPoolReady(t, 0)
			if tc.refill {
				h.cluster.Extensions.PrependWatchReactor("sandboxwarmpools", func(action k8stesting.Action) (bool, watch.Interface, error) {
					go h.cluster.SetPoolReady(t, 1)
					return false, nil, nil
				})
			}
			var log strings.Builder
			for _, args := range [][]string{{"prepare"}, {"run", h.script("true\n"), "cleanup_file_variables"}, {"cleanup"}} {
				code, out, errOut := h.run(args...)
				log.WriteString(out + errOut)
				if code != 0 {
					t.Fatalf("%v: exit %d\n%s", args, code, log.String())
				}
			}
			for _, line := range []string{`Sandbox ready: ` + tc.origin + `, pod `, `Sandbox summary: ` + tc.origin + `, claimed in `} {
				if !regexp.MustCompile(line).MatchString(log.String()) {
					t.Errorf("job log lacks %q:\n%s", line, log.String())
				}
			}
			origins := regexp.MustCompile(`warm start|waited \d+ ms for a warm sandbox|cold start`).FindAllString(log.String(), -1)
			if len(origins) != 2 || origins[0] != origins[1] {
				t.Errorf("the job log says how the job got its sandbox %d times (%q), want twice in the same words:\n%s", len(origins), origins, log.String())
			}
			if !tc.refill && strings.Contains(log.String(), "drained") {
				t.Errorf("the job log predicts from the pool's state before the claim:\n%s", log.String())
			}
		})
	}
}

func TestUsageErrorsAreOneLineNamingTheFix(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"config", "--config", "x.toml"}, "usage: --config goes before the command: sandbox-executor --config VALUE config"},
		{[]string{"bogus"}, `usage: unknown command "bogus": see sandbox-executor --help`},
		{[]string{"gc", "--bogus"}, "usage: flag provided but not defined: -bogus: see sandbox-executor gc --help"},
		{[]string{"tls", "init", "--dir"}, "usage: flag needs an argument: -dir: see sandbox-executor tls init --help"},
		{[]string{"tls", "bogus"}, `usage: unknown command "bogus": see sandbox-executor tls --help`},
		{[]string{"tls", "init"}, "tls init takes one of --dir (files) or --secret (in the cluster)"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			h := newHarness(t, "ci:1")
			code, out, errOut := h.run(tc.args...)
			if code != 1 {
				t.Errorf("exit %d, want BUILD_FAILURE (1): a bad command line does not get better by retrying", code)
			}
			if out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
				t.Errorf("stdout %q, stderr %q: want one line on stderr containing %q", out, errOut, tc.want)
			}
		})
	}
}

func TestVersionCommandIsTheVersionFlag(t *testing.T) {
	h := newHarness(t, "")
	code, verb, _ := h.run("version")
	_, flag, _ := h.run("--version")
	if code != 0 || verb != flag || !strings.Contains(verb, "sandbox-executor version") {
		t.Errorf("version: exit %d, %q; --version: %q", code, verb, flag)
	}
}

func TestHelpListsCommandsInProtocolOrder(t *testing.T) {
	_, out, _ := newHarness(t, "").run("--help")
	var order []int
	for _, cmd := range []string{"config ", "prepare ", "run ", "cleanup ", "serve ", "start-runner ", "gc ", "doctor ", "exporter ", "tls ", "version "} {
		order = append(order, strings.Index(out, "\n   "+cmd))
	}
	if slices.Contains(order, -1) || !slices.IsSorted(order) {
		t.Errorf("--help does not list the commands in protocol order, then the operator's:\n%s", out)
	}
}
