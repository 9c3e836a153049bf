package kube_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

func testRequest() kube.ClaimRequest {
	return kube.ClaimRequest{
		Namespace: fakecluster.Namespace, Name: kube.ClaimName("glcbt-job-a-token", "runner-a", 4242), Pool: "duo-default", Runner: "runner-a",
		Job:   kube.Job{ID: 4242, ProjectID: 7, PipelineID: 99, Timeout: time.Hour},
		Grace: 10 * time.Minute, ReadyTimeout: 5 * time.Second, RuntimeClasses: []string{"gvisor"},
		Binding: kube.JobBinding("glcbt-job-a-token", fakecluster.Namespace, kube.ClaimName("glcbt-job-a-token", "runner-a", 4242)),
	}
}

func TestClaimCreatesLabelledClaimWithLifecycle(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	c := kube.NewClaimer(fc.Clients, testingclock.NewFakePassiveClock(now))
	sbx, err := c.Claim(context.Background(), testRequest())
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	want := kube.Sandbox{Namespace: fakecluster.Namespace, Claim: kube.ClaimName("glcbt-job-a-token", "runner-a", 4242), Pool: "duo-default",
		SandboxName: "duo-default-abcde", Pod: "duo-default-abcde", Container: "job", Image: "ci:bookworm", RuntimeClass: "gvisor", Launch: kube.LaunchWarm, PodIP: fakecluster.PodIP}
	if *sbx != want {
		t.Errorf("sandbox = %+v\nwant      %+v", *sbx, want)
	}
	claim, err := fc.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace).Get(context.Background(), sbx.Claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{kube.LabelRunner: "runner-a", kube.LabelJobID: "4242", kube.LabelProjectID: "7", kube.LabelPipelineID: "99", kube.LabelManagedBy: "sandbox-executor"} {
		if claim.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, claim.Labels[k], v)
		}
	}
	lc := claim.Spec.Lifecycle
	if lc == nil || lc.ShutdownPolicy != extv1beta1.ShutdownPolicyDelete || !lc.ShutdownTime.Time.Equal(now.Add(70*time.Minute)) {
		t.Errorf("lifecycle = %+v, want Delete at job timeout + grace (%s)", lc, now.Add(70*time.Minute))
	}
	if len(claim.Spec.Env) != 0 || claim.Spec.WarmPoolRef.Name != "duo-default" {
		t.Errorf("claim spec must only reference the pool (env forces cold starts): %+v", claim.Spec)
	}
}

// A pod whose job container runs the agent baked into its template is told apart by its
// command alone: such templates give the container no stdin (nothing is written to it).
func TestClaimSeesABakedAgent(t *testing.T) {
	for _, baked := range []bool{false, true} {
		fc := fakecluster.NewCluster(t)
		fc.AgentBaked = baked
		sbx, err := kube.NewClaimer(fc.Clients, testingclock.NewFakePassiveClock(time.Now())).Claim(context.Background(), testRequest())
		if err != nil || sbx.AgentBaked != baked {
			t.Errorf("template bakes the agent in: %t; claimed %+v, %v", baked, sbx, err)
		}
	}
}

func TestClaimAdoptsItsOwnClaimOnRetry(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	c := fc.Claimer()
	assertRetryAdopts(t, func() (*kube.Sandbox, error) { return c.Claim(context.Background(), testRequest()) }, func() int {
		list, _ := fc.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace).List(context.Background(), metav1.ListOptions{})
		return len(list.Items)
	})
}

// assertRetryAdopts runs a prepare's acquire twice, as a retried prepare does: the second adopts
// what the first made (count objects in all), and gets the same sandbox.
func assertRetryAdopts(t *testing.T, acquire func() (*kube.Sandbox, error), count func() int) *kube.Sandbox {
	t.Helper()
	first, err := acquire()
	if err != nil {
		t.Fatal(err)
	}
	second, err := acquire()
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if *first != *second {
		t.Errorf("retry got %+v, want the same sandbox %+v", second, first)
	}
	if n := count(); n != 1 {
		t.Errorf("%d objects after a retry, want 1", n)
	}
	return first
}

func TestClaimFailsClosedOnRuntimeClass(t *testing.T) {
	for _, rc := range []string{"", "runc"} {
		fc := fakecluster.NewCluster(t)
		fc.RuntimeClass = rc
		_, err := fc.Claimer().Claim(context.Background(), testRequest())
		if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(err.Error(), "refusing pod") {
			t.Errorf("runtimeClass %q: err = %v, want a permanent refusal", rc, err)
		}
	}
}

func TestClaimReadyTimeoutNamesLastCondition(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	fc.ReadyReason = "SandboxNotReady"
	req := testRequest()
	req.ReadyTimeout = 300 * time.Millisecond
	_, err := fc.Claimer().Claim(context.Background(), req)
	if failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), "not Ready within ready_timeout 300ms") || !strings.Contains(err.Error(), "reason=SandboxNotReady") {
		t.Errorf("err = %v, want a timeout naming the last condition", err)
	}
}

func TestClaimPermanentReasonFailsFast(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	fc.ReadyReason = "TemplateNotFound"
	_, err := fc.Claimer().Claim(context.Background(), testRequest())
	if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(err.Error(), "TemplateNotFound") {
		t.Errorf("err = %v, want a permanent error naming TemplateNotFound", err)
	}
}

func TestAPIErrorsAreExplained(t *testing.T) {
	gr := schema.GroupResource{Group: "extensions.agents.x-k8s.io", Resource: "sandboxwarmpools"}
	missingCRD := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 404, Reason: metav1.StatusReasonNotFound, Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}}
	for _, tc := range []struct {
		name string
		err  error
		kind failure.Kind
		want string
	}{
		{"pool missing", apierrors.NewNotFound(gr, "duo-default"), failure.KindPermanent, `SandboxWarmPool "duo-default" not found in namespace "sandbox-executor"`},
		{"missing CRD", missingCRD, failure.KindPermanent, "CRD missing: the API server does not serve sandboxwarmpools.extensions.agents.x-k8s.io"},
		{"RBAC", apierrors.NewForbidden(gr, "duo-default", nil), failure.KindPermanent, `RBAC denied: cannot get sandboxwarmpools.extensions.agents.x-k8s.io in namespace sandbox-executor`},
		{"overloaded", apierrors.NewTooManyRequests("slow down", 1), failure.KindSystem, "kubernetes API error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := fakecluster.NewCluster(t)
			fc.Extensions.PrependReactor("get", "sandboxwarmpools", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
			_, err := fc.Claimer().CheckPool(context.Background(), fakecluster.Namespace, "duo-default")
			if failure.KindOf(err) != tc.kind || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v (kind %d), want kind %d containing %q", err, failure.KindOf(err), tc.kind, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans several lines: %q", err)
			}
		})
	}
}

// Release (a claim) and ReleaseColdStart (a cold start's Sandbox) may run any number of times.
func TestReleaseIsIdempotent(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		kind    string
		acquire func(c *kube.Claimer) (*kube.Sandbox, error)
		release func(c *kube.Claimer, sbx *kube.Sandbox) error
		gone    func(fc *fakecluster.Cluster, sbx *kube.Sandbox) error
	}{
		{"claim",
			func(c *kube.Claimer) (*kube.Sandbox, error) { return c.Claim(ctx, testRequest()) },
			func(c *kube.Claimer, sbx *kube.Sandbox) error {
				return c.Release(ctx, sbx.Namespace, sbx.Claim, testRequest().Binding, kube.Outcome{Result: kube.OutcomeSuccess})
			},
			func(fc *fakecluster.Cluster, sbx *kube.Sandbox) error {
				_, err := fc.Extensions.ExtensionsV1beta1().SandboxClaims(sbx.Namespace).Get(ctx, sbx.Claim, metav1.GetOptions{})
				return err
			}},
		{"cold start",
			func(c *kube.Claimer) (*kube.Sandbox, error) {
				return c.ColdStart(ctx, coldRequest(), fakecluster.Template)
			},
			func(c *kube.Claimer, sbx *kube.Sandbox) error {
				return c.ReleaseColdStart(ctx, sbx.Namespace, sbx.SandboxName, coldRequest().Binding, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonScript})
			},
			func(fc *fakecluster.Cluster, sbx *kube.Sandbox) error {
				_, err := fc.Sandboxes.AgentsV1beta1().Sandboxes(sbx.Namespace).Get(ctx, sbx.SandboxName, metav1.GetOptions{})
				return err
			}},
	} {
		fc := fakecluster.NewCluster(t)
		c := fc.Claimer()
		sbx, err := tc.acquire(c)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if err := tc.release(c, sbx); err != nil {
				t.Fatalf("%s: release #%d: %v", tc.kind, i+1, err)
			}
		}
		if err := tc.gone(fc, sbx); !apierrors.IsNotFound(err) {
			t.Errorf("%s still there after release: %v", tc.kind, err)
		}
	}
}

func TestClaimNameIsDeterministicAndDNSSafe(t *testing.T) {
	const token = "glcbt-64_s3cr3tJobT0ken"
	a, b := kube.ClaimName(token, "Runner One", 123456789), kube.ClaimName(token, "Runner One", 123456789)
	if a != b {
		t.Fatalf("ClaimName not deterministic: %s vs %s", a, b)
	}
	if !strings.HasPrefix(a, "job-123456789-") {
		t.Errorf("claim name %q: want the readable prefix job-123456789-", a)
	}
	if kube.ClaimName(token, "Runner Two", 123456789) == a {
		t.Error("two runners got the same claim name for one job id")
	}
	if kube.ClaimName(token, "Runner One", 123456788) == a {
		t.Error("two job ids got the same claim name")
	}
	if tokenless := kube.ClaimName("", "Runner One", 123456789); tokenless != kube.ClaimName("", "Runner One", 123456789) || tokenless == a {
		t.Error("ClaimName without a token is not deterministic")
	}
	long := strings.Repeat("a very long runner name, Ünïcode and_all. ", 20)
	for _, name := range []string{a, kube.ClaimName(token, long, 1<<62), kube.ClaimName("", long, 1), kube.ClaimName(token, "", 0)} {
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("claim name %q is not a DNS label: %v", name, errs)
		}
		if strings.Contains(name, token) || strings.Contains(name, "s3cr3t") {
			t.Errorf("claim name %q shows the token", name)
		}
	}
}

// The name is keyed with the job's token: a job with the same runner name and job ID but another
// token (another GitLab instance) gets another name, and knowing the runner name and job ID is not
// enough to predict it.
func TestClaimNameIsKeyedWithTheJobToken(t *testing.T) {
	mine := kube.ClaimName("glcbt-job-a-token", "runner-a", 4242)
	for _, other := range []string{"glcbt-job-b-token", "glcbt-job-a-tokeN", ""} {
		if kube.ClaimName(other, "runner-a", 4242) == mine {
			t.Errorf("token %q gives the claim name of another token: %s", other, mine)
		}
	}
}

// agent-sandbox adopts a pool sandbox for a claim with one patch (controller and claim-UID
// label), and writes the claim's Ready a status write later: prepare goes on from the adoption
// and does not wait for that write (here it never comes).
func TestClaimGoesOnFromTheAdoption(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	fc.ClaimStatusLags = true
	var steps []string
	c := fc.Claimer()
	c.Step = func(step string, _ time.Duration) { steps = append(steps, step) }
	sbx, err := c.Claim(context.Background(), testRequest())
	if err != nil {
		t.Fatalf("Claim: %v (steps %q)", err, steps)
	}
	if sbx.SandboxName != "duo-default-abcde" || sbx.Pod != "duo-default-abcde" || sbx.Launch != kube.LaunchWarm {
		t.Errorf("sandbox = %+v, want the adopted warm sandbox and its pod", sbx)
	}
	if len(steps) != 2 || !strings.HasPrefix(steps[1], "Sandbox duo-default-abcde adopted by the claim and Ready") {
		t.Errorf("steps = %q, want the adoption as the second", steps)
	}
}

// A stage that finds the job's sandbox by name (no state from prepare) right after a prepare that
// went on from the adoption finds the same sandbox, before the claim's status names it.
func TestFindBeforeTheClaimIsReady(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	fc.ClaimStatusLags = true
	req := testRequest()
	claimed, err := fc.Claimer().Claim(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	found, err := fc.Claimer().Find(context.Background(), req.Namespace, claimed.Claim, req.Binding, req.RuntimeClasses)
	if err != nil || found.Pod != claimed.Pod || found.SandboxName != claimed.SandboxName {
		t.Errorf("Find = %+v, %v; want the claimed sandbox %s", found, err, claimed.SandboxName)
	}
}

// In the stage server, a claim sees its adoption on the server's running watch of Sandboxes,
// goes on from it, and tells prepare the adopted sandbox's address and identity line read
// ahead, once, before it returns the sandbox verified.
func TestClaimAnnouncesTheAdoptedSandboxAhead(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	fc.ClaimStatusLags = true
	lines := kube.NewAgentLines(fc.Clients, fakecluster.Namespace)
	lines.KeepForTest("duo-default-abcde", "uid-1", "containerd://aaa", "10.88.0.5", "identity line\n")
	fc.Clients.AgentLines = lines
	ctx, cancel := context.WithCancel(context.Background())
	running := make(chan struct{})
	go func() { defer close(running); lines.Run(ctx) }()
	defer func() { cancel(); <-running }()
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return lines.WatchingForTest(), nil
	}); err != nil {
		t.Fatal("the stage server's watch of Sandboxes never ran")
	}
	req := testRequest()
	req.AgentLog = true
	var announced []string
	req.Ahead = func(podIP, line string) { announced = append(announced, podIP+" "+line) }
	sbx, err := fc.Claimer().Claim(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(announced) != 1 || announced[0] != "10.88.0.5 identity line\n" || sbx.Pod != "duo-default-abcde" {
		t.Errorf("announced %q for pod %s; want the line read ahead for duo-default-abcde, once", announced, sbx.Pod)
	}
	for _, action := range fc.Sandboxes.Actions() {
		if w, ok := action.(k8stesting.WatchAction); ok && w.GetWatchRestrictions().Labels.String() != "" {
			t.Errorf("the claim opened a watch of its own (%s) while the server's watch runs", w.GetWatchRestrictions().Labels)
		}
	}
}
