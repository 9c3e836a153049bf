package executor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/executor/executortest"
)

func testRequest() executor.ClaimRequest {
	return executor.ClaimRequest{
		Namespace: executortest.Namespace, Pool: "duo-default", Runner: "runner-a",
		Job:   &executor.Job{ID: 4242, ProjectID: 7, PipelineID: 99, Timeout: time.Hour},
		Grace: 10 * time.Minute, ReadyTimeout: 5 * time.Second, RuntimeClasses: []string{"gvisor"},
	}
}

func TestClaimCreatesLabelledClaimWithLifecycle(t *testing.T) {
	fc := executortest.NewCluster(t)
	now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	c := &executor.Claimer{Clients: fc.Clients, Now: func() time.Time { return now }}
	sbx, err := c.Claim(context.Background(), testRequest())
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	want := executor.Sandbox{Namespace: executortest.Namespace, Claim: executor.ClaimName("runner-a", 4242), Pool: "duo-default",
		SandboxName: "duo-default-abcde", Pod: "duo-default-abcde", Container: "job", RuntimeClass: "gvisor", Warm: true, PodIP: executortest.PodIP}
	if *sbx != want {
		t.Errorf("sandbox = %+v\nwant      %+v", *sbx, want)
	}
	claim, err := fc.Extensions.ExtensionsV1beta1().SandboxClaims(executortest.Namespace).Get(context.Background(), sbx.Claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{executor.LabelRunner: "runner-a", executor.LabelJobID: "4242", executor.LabelProjectID: "7", executor.LabelPipelineID: "99", executor.LabelManagedBy: "sandbox-executor"} {
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

func TestClaimAdoptsItsOwnClaimOnRetry(t *testing.T) {
	fc := executortest.NewCluster(t)
	c := &executor.Claimer{Clients: fc.Clients}
	assertRetryAdopts(t, func() (*executor.Sandbox, error) { return c.Claim(context.Background(), testRequest()) }, func() int {
		list, _ := fc.Extensions.ExtensionsV1beta1().SandboxClaims(executortest.Namespace).List(context.Background(), metav1.ListOptions{})
		return len(list.Items)
	})
}

// assertRetryAdopts runs a prepare's acquire twice, as a retried prepare does: the second adopts
// what the first made (count objects in all), and gets the same sandbox.
func assertRetryAdopts(t *testing.T, acquire func() (*executor.Sandbox, error), count func() int) *executor.Sandbox {
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
		fc := executortest.NewCluster(t)
		fc.RuntimeClass = rc
		_, err := (&executor.Claimer{Clients: fc.Clients}).Claim(context.Background(), testRequest())
		if executor.KindOf(err) != executor.KindPermanent || !strings.Contains(err.Error(), "refusing pod") {
			t.Errorf("runtimeClass %q: err = %v, want a permanent refusal", rc, err)
		}
	}
}

func TestClaimReadyTimeoutNamesLastCondition(t *testing.T) {
	fc := executortest.NewCluster(t)
	fc.ReadyReason = "SandboxNotReady"
	req := testRequest()
	req.ReadyTimeout = 300 * time.Millisecond
	_, err := (&executor.Claimer{Clients: fc.Clients}).Claim(context.Background(), req)
	if executor.KindOf(err) != executor.KindSystem || !strings.Contains(err.Error(), "not Ready within ready_timeout 300ms") || !strings.Contains(err.Error(), "reason=SandboxNotReady") {
		t.Errorf("err = %v, want a timeout naming the last condition", err)
	}
}

func TestClaimPermanentReasonFailsFast(t *testing.T) {
	fc := executortest.NewCluster(t)
	fc.ReadyReason = "TemplateNotFound"
	_, err := (&executor.Claimer{Clients: fc.Clients}).Claim(context.Background(), testRequest())
	if executor.KindOf(err) != executor.KindPermanent || !strings.Contains(err.Error(), "TemplateNotFound") {
		t.Errorf("err = %v, want a permanent error naming TemplateNotFound", err)
	}
}

func TestAPIErrorsAreExplained(t *testing.T) {
	gr := schema.GroupResource{Group: "extensions.agents.x-k8s.io", Resource: "sandboxwarmpools"}
	missingCRD := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 404, Reason: metav1.StatusReasonNotFound, Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}}
	for _, tc := range []struct {
		name string
		err  error
		kind executor.Kind
		want string
	}{
		{"pool missing", apierrors.NewNotFound(gr, "duo-default"), executor.KindPermanent, `SandboxWarmPool "duo-default" not found in namespace "sandbox-executor"`},
		{"missing CRD", missingCRD, executor.KindPermanent, "CRD missing: the API server does not serve sandboxwarmpools.extensions.agents.x-k8s.io"},
		{"RBAC", apierrors.NewForbidden(gr, "duo-default", nil), executor.KindPermanent, `RBAC denied: cannot get sandboxwarmpools.extensions.agents.x-k8s.io in namespace sandbox-executor`},
		{"overloaded", apierrors.NewTooManyRequests("slow down", 1), executor.KindSystem, "kubernetes API error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := executortest.NewCluster(t)
			fc.Extensions.PrependReactor("get", "sandboxwarmpools", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
			_, err := (&executor.Claimer{Clients: fc.Clients}).CheckPool(context.Background(), executortest.Namespace, "duo-default")
			if executor.KindOf(err) != tc.kind || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v (kind %d), want kind %d containing %q", err, executor.KindOf(err), tc.kind, tc.want)
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
		acquire func(c *executor.Claimer) (*executor.Sandbox, error)
		release func(c *executor.Claimer, sbx *executor.Sandbox) error
		gone    func(fc *executortest.Cluster, sbx *executor.Sandbox) error
	}{
		{"claim",
			func(c *executor.Claimer) (*executor.Sandbox, error) { return c.Claim(ctx, testRequest()) },
			func(c *executor.Claimer, sbx *executor.Sandbox) error {
				return c.Release(ctx, sbx.Namespace, sbx.Claim)
			},
			func(fc *executortest.Cluster, sbx *executor.Sandbox) error {
				_, err := fc.Extensions.ExtensionsV1beta1().SandboxClaims(sbx.Namespace).Get(ctx, sbx.Claim, metav1.GetOptions{})
				return err
			}},
		{"cold start",
			func(c *executor.Claimer) (*executor.Sandbox, error) {
				return c.ColdStart(ctx, coldRequest(), executortest.Template)
			},
			func(c *executor.Claimer, sbx *executor.Sandbox) error {
				return c.ReleaseColdStart(ctx, sbx.Namespace, sbx.SandboxName)
			},
			func(fc *executortest.Cluster, sbx *executor.Sandbox) error {
				_, err := fc.Sandboxes.AgentsV1beta1().Sandboxes(sbx.Namespace).Get(ctx, sbx.SandboxName, metav1.GetOptions{})
				return err
			}},
	} {
		fc := executortest.NewCluster(t)
		c := &executor.Claimer{Clients: fc.Clients}
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
	a, b := executor.ClaimName("Runner One", 123456789), executor.ClaimName("Runner One", 123456789)
	if a != b {
		t.Fatalf("ClaimName not deterministic: %s vs %s", a, b)
	}
	if executor.ClaimName("Runner Two", 123456789) == a {
		t.Error("two runners got the same claim name for one job id")
	}
	if len(a) > 63 || strings.ToLower(a) != a || strings.ContainsAny(a, " _.") {
		t.Errorf("claim name %q is not a DNS label", a)
	}
}
