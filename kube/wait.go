package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// watcher is the part of a typed client that watchNamed uses.
type watcher interface {
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// errVersionGone says the API server no longer has the resourceVersion a watch would resume
// from (410 Gone): the caller re-reads the object and watches from the version it reads.
var errVersionGone = errors.New("watched resourceVersion is gone")

// watchNamed watches the object call names from resourceVersion, handing its events to update
// until update says it is done or fails. client-go's RetryWatcher re-establishes the
// watch whenever the API server ends it (timeouts, restarts), resuming from the last version
// seen, and ends it for good on RBAC denial, which is reported at once like any other API error.
func watchNamed(ctx context.Context, client watcher, call apiCall, resourceVersion string, update func(watch.Event) (bool, error)) error {
	selector := fields.OneTermEqualSelector("metadata.name", call.Name).String()
	w, err := watchtools.NewRetryWatcherWithContext(ctx, resourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			return client.Watch(ctx, opts)
		},
	})
	if err != nil {
		return failure.SystemError(err, "cannot %s", call)
	}
	// UntilWithoutRetry stops the watcher; waiting for it leaves no goroutine behind.
	defer func() { <-w.Done() }()
	_, err = watchtools.UntilWithoutRetry(ctx, w, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				return false, errVersionGone
			}
			return false, explainAPIError(err, call)
		}
		// The field selector already names the object; the check keeps fake clients (which
		// ignore selectors) honest.
		if obj, err := meta.Accessor(ev.Object); err != nil || obj.GetName() != call.Name {
			return false, nil
		}
		return update(ev)
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, watchtools.ErrWatchClosed):
		return failure.SystemError(err, "cannot %s", call)
	}
	return err
}

// readable is the part of a typed client that waitReady uses: a SandboxClaims or a Sandboxes
// client of one namespace.
type readable[T any] interface {
	watcher
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
}

// readyWatch is an object prepare waits for until it is Ready: the job's claim, or the Sandbox
// of a cold start.
type readyWatch[T metav1.Object] struct {
	kind     string // "SandboxClaim", for messages
	resource string // plural resource with group, for RBAC messages
	// origin is what the object comes from, for the timeout message: "pool duo-default".
	origin string
	client readable[T]
	// state says whether obj is Ready, whether waiting can no longer make it Ready, and where
	// it stands otherwise.
	state func(obj T) (ready, hopeless bool, why string)
}

// waitReady watches obj, from the version given, until it is Ready, and gives up after timeout
// naming the last condition seen. It never polls on a timer.
func waitReady[T metav1.Object](ctx context.Context, rw readyWatch[T], obj T, timeout time.Duration) (T, error) {
	var none T
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ns, name := obj.GetNamespace(), obj.GetName()
	last := "no status yet"
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
	for {
		if done, err := settled(obj); done {
			return settledResult(obj, err)
		}
		// One watch serves every update until Ready: a new watch per update would pay a round
		// trip, and the API server's wait for its cache to reach the version, each time.
		err := watchNamed(ctx, rw.client, apiCall{"watch", rw.resource, ns, name}, obj.GetResourceVersion(), func(ev watch.Event) (bool, error) {
			if ev.Type == watch.Deleted {
				return false, failure.SystemError(nil, "%s %s was deleted while waiting for it to become Ready", rw.kind, name)
			}
			next, ok := ev.Object.(T)
			if !ok {
				return false, nil
			}
			obj = next
			return settled(obj)
		})
		if errors.Is(err, errVersionGone) {
			// RetryWatcher cannot resume from a version the API server has compacted away:
			// re-read the object and watch from the version read.
			if obj, err = rw.client.Get(ctx, name, metav1.GetOptions{}); err == nil {
				continue
			}
			err = explainAPIError(err, apiCall{"get", rw.resource, ns, name})
		}
		switch {
		case err == nil:
			return obj, nil
		case ctx.Err() == context.DeadlineExceeded:
			return none, failure.SystemError(nil, "%s %s/%s (%s) not Ready within ready_timeout %s; last condition: %s", rw.kind, ns, name, rw.origin, timeout, last)
		case ctx.Err() != nil:
			return none, failure.SystemError(ctx.Err(), "waiting for %s %s/%s", rw.kind, ns, name)
		}
		return none, err
	}
}

func settledResult[T any](obj T, err error) (T, error) {
	if err != nil {
		var none T
		return none, err
	}
	return obj, nil
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
