package kube_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

func TestJobBindingIsKeyedAndObjectSpecific(t *testing.T) {
	const token = "glcbt-64_s3cr3tJobT0ken"
	b := kube.JobBinding(token, "ns", "job-1-abc")
	if b != kube.JobBinding(token, "ns", "job-1-abc") || !strings.HasPrefix(b, "v1:") || len(b) != len("v1:")+64 {
		t.Fatalf("binding %q: want a stable v1: HMAC-SHA256 in hex", b)
	}
	if strings.Contains(b, token) || strings.Contains(b, "s3cr3t") {
		t.Errorf("binding %q shows the token", b)
	}
	for _, other := range []string{
		kube.JobBinding("glcbt-other-token", "ns", "job-1-abc"),
		kube.JobBinding(token, "ns2", "job-1-abc"),
		kube.JobBinding(token, "ns", "job-1-abd"),
	} {
		if other == b {
			t.Errorf("binding does not depend on token, namespace and name: %q", b)
		}
	}
	if kube.JobBinding("", "ns", "job-1-abc") != "" {
		t.Error("no token must bind nothing")
	}
}

// otherJob is the request of a job with another token whose claim has testRequest's name. A job
// of another token gets another name (ClaimName is keyed with it), so this is what remains: an
// object of that name made by hand, or by someone who learnt the name, must still not be taken
// for the job's.
func otherJob(req kube.ClaimRequest) kube.ClaimRequest {
	req.Binding = kube.JobBinding("glcbt-job-b-token", req.Namespace, req.Name)
	return req
}

func assertOtherJobRefused(t *testing.T, what string, err error, kind, name string) {
	t.Helper()
	fix := "kubectl delete " + strings.ToLower(kind) + " " + name + " -n " + fakecluster.Namespace
	if failure.KindOf(err) != failure.KindPermanent || !errors.Is(err, kube.ErrOtherJob) ||
		!strings.Contains(err.Error(), kind+" "+fakecluster.Namespace+"/"+name+" was made by another job") ||
		!strings.Contains(err.Error(), fix) || strings.Contains(err.Error(), "\n") {
		t.Errorf("%s: err = %v; want one permanent line naming %s %s and %q", what, err, kind, name, fix)
	}
}

// A job with the same claim name but another token neither adopts, finds nor releases the claim;
// the job that made it still does all three.
func TestClaimIsBoundToTheJobThatMadeIt(t *testing.T) {
	ctx := context.Background()
	fc := fakecluster.NewCluster(t)
	c := fc.Claimer()
	req := testRequest()
	mine, err := c.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	claims := fc.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace)
	before, err := claims.Get(ctx, mine.Claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if before.Annotations[kube.AnnotationJobBinding] != req.Binding {
		t.Fatalf("claim annotations %v: want the job's binding", before.Annotations)
	}
	other := otherJob(req)
	_, err = c.Claim(ctx, other)
	assertOtherJobRefused(t, "Claim", err, "SandboxClaim", mine.Claim)
	_, err = c.Find(ctx, req.Namespace, mine.Claim, other.Binding, req.RuntimeClasses)
	assertOtherJobRefused(t, "Find", err, "SandboxClaim", mine.Claim)
	err = c.Release(ctx, req.Namespace, mine.Claim, other.Binding, kube.Outcome{})
	assertOtherJobRefused(t, "Release", err, "SandboxClaim", mine.Claim)
	// A job from a runner without JOB_RESPONSE_FILE has no binding: it proves nothing either.
	_, err = c.Find(ctx, req.Namespace, mine.Claim, "", req.RuntimeClasses)
	assertOtherJobRefused(t, "Find without a binding", err, "SandboxClaim", mine.Claim)

	after, err := claims.Get(ctx, mine.Claim, metav1.GetOptions{})
	if err != nil || after.UID != before.UID || after.DeletionTimestamp != nil || after.Annotations[kube.AnnotationJobBinding] != req.Binding {
		t.Fatalf("the claim was touched by the other job: %+v, %v", after, err)
	}
	again, err := c.Claim(ctx, req)
	if err != nil || *again != *mine {
		t.Fatalf("the job's retried prepare: %+v, %v; want to adopt %+v", again, err, mine)
	}
	if found, err := c.Find(ctx, req.Namespace, mine.Claim, req.Binding, req.RuntimeClasses); err != nil || *found != *mine {
		t.Fatalf("Find by the job: %+v, %v", found, err)
	}
	if err := c.Release(ctx, req.Namespace, mine.Claim, req.Binding, kube.Outcome{}); err != nil {
		t.Fatal(err)
	}
	if _, err := claims.Get(ctx, mine.Claim, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the job's own release left its claim: %v", err)
	}
}

func TestColdStartIsBoundToTheJobThatMadeIt(t *testing.T) {
	ctx := context.Background()
	fc := fakecluster.NewCluster(t)
	c := fc.Claimer()
	req := coldRequest()
	mine, err := c.ColdStart(ctx, req, fakecluster.Template)
	if err != nil {
		t.Fatal(err)
	}
	other := otherJob(req)
	_, err = c.ColdStart(ctx, other, fakecluster.Template)
	assertOtherJobRefused(t, "ColdStart", err, "Sandbox", mine.SandboxName)
	_, err = c.Find(ctx, req.Namespace, mine.SandboxName, other.Binding, req.RuntimeClasses)
	assertOtherJobRefused(t, "Find", err, "Sandbox", mine.SandboxName)
	err = c.ReleaseColdStart(ctx, req.Namespace, mine.SandboxName, other.Binding, kube.Outcome{})
	assertOtherJobRefused(t, "ReleaseColdStart", err, "Sandbox", mine.SandboxName)
	sandboxes := fc.Sandboxes.AgentsV1beta1().Sandboxes(fakecluster.Namespace)
	if sbx, err := sandboxes.Get(ctx, mine.SandboxName, metav1.GetOptions{}); err != nil || sbx.DeletionTimestamp != nil {
		t.Fatalf("the other job touched the Sandbox: %v", err)
	}
	if again, err := c.ColdStart(ctx, req, fakecluster.Template); err != nil || *again != *mine {
		t.Fatalf("the job's retried prepare: %+v, %v; want to adopt %+v", again, err, mine)
	}
	if err := c.ReleaseColdStart(ctx, req.Namespace, mine.SandboxName, req.Binding, kube.Outcome{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sandboxes.Get(ctx, mine.SandboxName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the job's own release left its Sandbox: %v", err)
	}
}

// gc is the operator's way to clear a claim a job refused: it releases any job's.
func TestReleaseAnyJobIgnoresTheBinding(t *testing.T) {
	ctx := context.Background()
	fc := fakecluster.NewCluster(t)
	c := fc.Claimer()
	mine, err := c.Claim(ctx, testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, fakecluster.Namespace, mine.Claim, kube.AnyJob, kube.Outcome{}); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace).Get(ctx, mine.Claim, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("claim still there: %v", err)
	}
}
