package kube

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
)

// watchable is the part of a typed client that waitReady uses: a SandboxClaims or a Sandboxes
// client of one namespace.
type watchable[T any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// readyWatch is an object prepare waits for until it is Ready: the job's claim, or the Sandbox
// of a cold start.
type readyWatch[T metav1.Object] struct {
	kind     string // "SandboxClaim", for messages
	resource string // plural resource with group, for RBAC messages
	// origin is what the object comes from, for the timeout message: "pool duo-default".
	origin string
	client watchable[T]
	// state says whether obj is Ready, whether waiting can no longer make it Ready, and where
	// it stands otherwise.
	state func(obj T) (ready, hopeless bool, why string)
}

// waitReady watches obj until it is Ready. It re-establishes the watch when the API server ends
// it, never polls on a timer, and gives up after timeout naming the last condition seen.
func waitReady[T metav1.Object](ctx context.Context, rw readyWatch[T], obj T, timeout time.Duration) (T, error) {
	var none T
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ns, name := obj.GetNamespace(), obj.GetName()
	last := "no status yet"
	timedOut := func() (T, error) {
		if ctx.Err() == context.DeadlineExceeded {
			return none, failure.SystemError(nil, "%s %s/%s (%s) not Ready within ready_timeout %s; last condition: %s", rw.kind, ns, name, rw.origin, timeout, last)
		}
		return none, failure.SystemError(ctx.Err(), "waiting for %s %s/%s", rw.kind, ns, name)
	}
	// settled says whether waiting is over for this version of the object.
	settled := func(o T) (bool, error) {
		ready, hopeless, why := rw.state(o)
		if why != "" {
			last = why
		}
		if hopeless {
			return true, failure.PermanentError(nil, "%s %s/%s cannot become Ready: %s", rw.kind, ns, name, last)
		}
		return ready, nil
	}
	// Re-watches back off so that a watch that keeps failing does not spin.
	rewatch := wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 2 * time.Second}
	for {
		if done, err := settled(obj); done {
			return settledResult(obj, err)
		}
		w, err := rw.client.Watch(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: obj.GetResourceVersion(),
		})
		if err != nil {
			if ctx.Err() != nil {
				return timedOut()
			}
			return none, explainAPIError(err, apiCall{"watch", rw.resource, ns, name})
		}
		// One watch serves every update until Ready: a new watch per update would pay a round
		// trip, and the API server's wait for its cache to reach the version, each time.
		var found bool
		for {
			var next T
			next, found, err = nextUpdate[T](ctx, w, rw.kind, name)
			if !found || err != nil {
				break
			}
			obj = next
			if done, err := settled(obj); done {
				w.Stop()
				return settledResult(obj, err)
			}
		}
		w.Stop()
		switch {
		case ctx.Err() != nil:
			return timedOut()
		case err != nil:
			return none, err
		}
		// The watch ended (API server timeout or restart, conversion webhook down): re-read
		// and watch again, backing off so a watch that keeps failing does not spin.
		select {
		case <-time.After(rewatch.Step()):
		case <-ctx.Done():
			return timedOut()
		}
		fresh, err := rw.client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return timedOut()
			}
			return none, explainAPIError(err, apiCall{"get", rw.resource, ns, name})
		}
		obj = fresh
	}
}

func settledResult[T any](obj T, err error) (T, error) {
	if err != nil {
		var none T
		return none, err
	}
	return obj, nil
}

// nextUpdate returns the next version of the object, or found = false when the watch closed.
func nextUpdate[T metav1.Object](ctx context.Context, w watch.Interface, kind, name string) (obj T, found bool, err error) {
	for {
		select {
		case <-ctx.Done():
			return obj, false, nil
		case ev, open := <-w.ResultChan():
			if !open {
				return obj, false, nil
			}
			switch ev.Type {
			case watch.Deleted:
				return obj, false, failure.SystemError(nil, "%s %s was deleted while waiting for it to become Ready", kind, name)
			case watch.Error:
				// Typically "resource version too old": re-read and watch again.
				return obj, false, nil
			}
			if next, ok := ev.Object.(T); ok && next.GetName() == name {
				return next, true, nil
			}
		}
	}
}

// readyState reads the Ready condition of a claim or a Sandbox: whether it is True, whether its
// reason is one of hopelessReasons (waiting cannot fix it), and where it stands otherwise.
func readyState(conditions []metav1.Condition, hopelessReasons []string) (ready, hopeless bool, why string) {
	cond := meta.FindStatusCondition(conditions, string(sandboxv1beta1.SandboxConditionReady))
	if cond == nil {
		return false, false, "no Ready condition yet"
	}
	if cond.Status == metav1.ConditionTrue {
		return true, false, ""
	}
	return false, slices.Contains(hopelessReasons, cond.Reason), fmt.Sprintf("Ready=%s reason=%s message=%q", cond.Status, cond.Reason, cond.Message)
}
