package kube

import (
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// PoolStatus is what prepare reports about the pool before claiming from it.
type PoolStatus struct {
	Replicas, Ready int32
}

// CheckPool confirms the pool exists (and, with it, that the CRDs are installed).
func (c *Claimer) CheckPool(ctx context.Context, namespace, pool string) (PoolStatus, error) {
	p, err := c.clients.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace).Get(ctx, pool, metav1.GetOptions{})
	if isObjectNotFound(err) {
		return PoolStatus{}, failure.PermanentError(nil, "SandboxWarmPool %q not found in namespace %q: create it or fix [[pool]] name in the executor config", pool, namespace)
	}
	if err != nil {
		return PoolStatus{}, explainAPIError(err, apiCall{"get", SandboxWarmPools.String(), namespace, pool})
	}
	status := PoolStatus{Ready: p.Status.ReadyReplicas}
	if p.Spec.Replicas != nil {
		status.Replicas = *p.Spec.Replicas
	}
	return status, nil
}

// WaitPoolReady watches the pool until it has a ready sandbox, for up to timeout.
func (c *Claimer) WaitPoolReady(ctx context.Context, namespace, pool string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pools := c.clients.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace)
	for {
		// List, then watch from the list's resourceVersion: no readiness change falls between.
		list, err := pools.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", pool).String()})
		if err == nil && len(list.Items) == 1 && list.Items[0].Status.ReadyReplicas > 0 {
			return nil
		}
		if err == nil {
			err = watchNamed(ctx, pools, apiCall{"watch", SandboxWarmPools.String(), namespace, pool}, list.ResourceVersion, func(ev watch.Event) (bool, error) {
				p, ok := ev.Object.(*extv1beta1.SandboxWarmPool)
				return ok && ev.Type != watch.Deleted && p.Status.ReadyReplicas > 0, nil
			})
		} else {
			err = explainAPIError(err, apiCall{"list", SandboxWarmPools.String(), namespace, pool})
		}
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return failure.SystemError(nil, "warm pool %s/%s had no ready sandbox for %s (drained_pool = \"wait\"): add replicas or use drained_pool = \"cold\"", namespace, pool, timeout)
		case !errors.Is(err, errVersionGone):
			return err
		}
		// RetryWatcher cannot resume from a version the API server has compacted away: list
		// again and watch from the version listed.
	}
}
