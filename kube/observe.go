package kube

import (
	"context"
	"reflect"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extinformers "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/informers/externalversions"
	extlisters "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/listers/api/v1beta1"
	sandboxinformers "sigs.k8s.io/agent-sandbox/clients/k8s/informers/externalversions"
	sandboxlisters "sigs.k8s.io/agent-sandbox/clients/k8s/listers/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/failure"
)

// ObservePermissions is what the exporter reads, all of it list and watch in its namespace:
// deploy/monitoring grants exactly this (a unit test holds the two together). Nothing secret:
// no Secrets, no exec, no logs.
var ObservePermissions = []Permission{
	{SandboxWarmPools.Group, SandboxWarmPools.Resource, "list", "exporter: pools' desired and ready sandboxes"},
	{SandboxWarmPools.Group, SandboxWarmPools.Resource, "watch", "exporter: pools' desired and ready sandboxes"},
	{SandboxClaims.Group, SandboxClaims.Resource, "list", "exporter: claims, their Ready time, shutdownTime and recorded outcome"},
	{SandboxClaims.Group, SandboxClaims.Resource, "watch", "exporter: claims, their Ready time, shutdownTime and recorded outcome"},
	{Sandboxes.Group, Sandboxes.Resource, "list", "exporter: how each claim got its sandbox (launch type, Ready time)"},
	{Sandboxes.Group, Sandboxes.Resource, "watch", "exporter: how each claim got its sandbox (launch type, Ready time)"},
	{Pods.Group, Pods.Resource, "list", "exporter: pool pods held out of service by their egress fence"},
	{Pods.Group, Pods.Resource, "watch", "exporter: pool pods held out of service by their egress fence"},
}

// JobStart is a job's sandbox turning Ready for it, seen once per claim (or cold-started
// Sandbox).
type JobStart struct {
	Pool   string
	Launch Launch
	// ClaimToReady is from the claim's creation to its Ready condition, both as the API records
	// them (one-second resolution); zero for a cold-started Sandbox, which has no claim.
	ClaimToReady time.Duration
}

// JobEnd is a job's recorded outcome (Release), seen once per claim or cold-started Sandbox.
type JobEnd struct {
	Pool    string
	Outcome Outcome
}

// PoolState is one warm pool as the exporter reports it.
type PoolState struct {
	Name string
	// Desired is spec.replicas, Ready and Total the controller's status: Total-Ready are booting.
	Desired, Ready, Total int32
	// ClaimsWaiting are this pool's claims not Ready yet, ClaimsReady those handed a sandbox.
	ClaimsWaiting, ClaimsReady int
	// ClaimsPastShutdown are this pool's claims whose shutdownTime has passed: leaked, since the
	// controller deletes a claim at its shutdownTime.
	ClaimsPastShutdown int
	// FenceHeldOut are this pool's pods that run but are not Ready because their agent's
	// readiness probe, the egress fence check, fails.
	FenceHeldOut int
}

// Observer follows a namespace's pools, claims, sandboxes and pods through informers (one watch
// each) for the exporter: events as jobs start and end, and a snapshot of the pools on demand.
type Observer struct {
	clients   *Clients
	namespace string
	kube      informers.SharedInformerFactory
	sandboxes sandboxinformers.SharedInformerFactory
	ext       extinformers.SharedInformerFactory

	pools      extlisters.SandboxWarmPoolLister
	claims     extlisters.SandboxClaimLister
	sandboxSet sandboxlisters.SandboxLister
	pods       corelisters.PodLister

	onStart func(JobStart)
	onEnd   func(JobEnd)

	mu      sync.Mutex
	started map[types.UID]bool // claims and cold starts whose start is counted
	ended   map[types.UID]bool // ... whose outcome is counted
}

// Observe prepares an Observer of namespace; Run starts it. onStart and onEnd are called once
// per job, from the informers' goroutines; nil for a reader of Pools only (the metrics adapter).
func (c *Clients) Observe(namespace string, onStart func(JobStart), onEnd func(JobEnd)) *Observer {
	if onStart == nil {
		onStart = func(JobStart) {}
	}
	if onEnd == nil {
		onEnd = func(JobEnd) {}
	}
	o := &Observer{
		clients:   c,
		namespace: namespace,
		// No resync: every change arrives as a watch event, and a snapshot reads the caches.
		kube:      informers.NewSharedInformerFactoryWithOptions(c.Kube, 0, informers.WithNamespace(namespace)),
		sandboxes: sandboxinformers.NewSharedInformerFactoryWithOptions(c.Sandboxes, 0, sandboxinformers.WithNamespace(namespace)),
		ext:       extinformers.NewSharedInformerFactoryWithOptions(c.Extensions, 0, extinformers.WithNamespace(namespace)),
		onStart:   onStart,
		onEnd:     onEnd,
		started:   map[types.UID]bool{},
		ended:     map[types.UID]bool{},
	}
	o.pools = o.ext.Extensions().V1beta1().SandboxWarmPools().Lister()
	o.claims = o.ext.Extensions().V1beta1().SandboxClaims().Lister()
	o.sandboxSet = o.sandboxes.Agents().V1beta1().Sandboxes().Lister()
	o.pods = o.kube.Core().V1().Pods().Lister()
	return o
}

// Run starts the informers and returns once their caches hold the namespace, or with an error
// naming what could not be listed. The informers stop with ctx; Shutdown waits for them.
func (o *Observer) Run(ctx context.Context) error {
	// An informer whose list is refused retries forever: ask once first, so that missing RBAC or
	// CRDs are one clear error instead of an exporter that never serves.
	if err := o.canList(ctx); err != nil {
		return err
	}
	claimInformer := o.ext.Extensions().V1beta1().SandboxClaims().Informer()
	sandboxInformer := o.sandboxes.Agents().V1beta1().Sandboxes().Informer()
	handlers := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{claimInformer, cache.ResourceEventHandlerDetailedFuncs{
			AddFunc:    func(obj any, initial bool) { o.claimChanged(obj, initial) },
			UpdateFunc: func(_, obj any) { o.claimChanged(obj, false) },
			DeleteFunc: o.forget,
		}},
		{sandboxInformer, cache.ResourceEventHandlerDetailedFuncs{
			AddFunc:    func(obj any, initial bool) { o.sandboxChanged(obj, initial) },
			UpdateFunc: func(_, obj any) { o.sandboxChanged(obj, false) },
			DeleteFunc: o.forget,
		}},
	}
	for _, h := range handlers {
		if _, err := h.informer.AddEventHandler(h.handler); err != nil {
			return failure.SystemError(err, "exporter: watching %s", o.namespace)
		}
	}
	// Touch the other listers' informers so that the factories start them.
	o.ext.Extensions().V1beta1().SandboxWarmPools().Informer()
	o.kube.Core().V1().Pods().Informer()
	o.kube.Start(ctx.Done())
	o.sandboxes.Start(ctx.Done())
	o.ext.Start(ctx.Done())
	for name, synced := range map[string]map[string]bool{
		"pods":                        typeNames(o.kube.WaitForCacheSync(ctx.Done())),
		Sandboxes.String():            typeNames(o.sandboxes.WaitForCacheSync(ctx.Done())),
		"claims and sandboxwarmpools": typeNames(o.ext.WaitForCacheSync(ctx.Done())),
	} {
		for typ, ok := range synced {
			if !ok {
				return failure.SystemError(ctx.Err(), "exporter: could not list %s (%s) in namespace %s: check the exporter's RBAC (ObservePermissions) and that agent-sandbox's CRDs are installed", name, typ, o.namespace)
			}
		}
	}
	return nil
}

// canList lists one object of each resource the informers follow.
func (o *Observer) canList(ctx context.Context) error {
	one := metav1.ListOptions{Limit: 1}
	for _, try := range []struct {
		resource string
		list     func() error
	}{
		{SandboxWarmPools.String(), func() error {
			_, err := o.clients.Extensions.ExtensionsV1beta1().SandboxWarmPools(o.namespace).List(ctx, one)
			return err
		}},
		{SandboxClaims.String(), func() error {
			_, err := o.clients.Extensions.ExtensionsV1beta1().SandboxClaims(o.namespace).List(ctx, one)
			return err
		}},
		{Sandboxes.String(), func() error {
			_, err := o.clients.Sandboxes.AgentsV1beta1().Sandboxes(o.namespace).List(ctx, one)
			return err
		}},
		{Pods.String(), func() error { _, err := o.clients.Kube.CoreV1().Pods(o.namespace).List(ctx, one); return err }},
	} {
		if err := try.list(); err != nil {
			return explainAPIError(err, apiCall{Verb: "list", Resource: try.resource, Namespace: o.namespace})
		}
	}
	return nil
}

// Shutdown waits for the informers' goroutines after Run's ctx is done.
func (o *Observer) Shutdown() {
	o.kube.Shutdown()
	o.sandboxes.Shutdown()
	o.ext.Shutdown()
}

func typeNames(synced map[reflect.Type]bool) map[string]bool {
	out := map[string]bool{}
	for k, v := range synced {
		out[k.String()] = v
	}
	return out
}

// claimChanged counts a claim's start the first time it is seen Ready with its sandbox known,
// and its end the first time it carries an outcome. A claim already Ready when the exporter
// starts (initial) is not counted: the exporter before it did, and counters start from zero.
func (o *Observer) claimChanged(obj any, initial bool) {
	claim, ok := obj.(*extv1beta1.SandboxClaim)
	if !ok {
		return
	}
	o.countEnd(claim.UID, claim.Spec.WarmPoolRef.Name, claim, initial)
	ready, _ := claimReady(claim)
	if !ready {
		return
	}
	sbx, err := o.sandboxSet.Sandboxes(claim.Namespace).Get(claim.Status.SandboxStatus.Name)
	if err != nil {
		return // not in the cache yet: its event comes, and sandboxChanged counts then
	}
	o.countStart(claim, sbx, initial)
}

// sandboxChanged counts the start of a claim whose sandbox reached the cache after the claim
// turned Ready, and the start and end of a cold-started Sandbox (no claim, no pool).
func (o *Observer) sandboxChanged(obj any, initial bool) {
	sbx, ok := obj.(*sandboxv1beta1.Sandbox)
	if !ok {
		return
	}
	if isColdStart(sbx) {
		o.countEnd(sbx.UID, "", sbx, initial)
		if sandboxReady(sbx) {
			o.once(o.started, sbx.UID, initial, func() { o.onStart(JobStart{Launch: LaunchCold}) })
		}
		return
	}
	owner := metav1.GetControllerOf(sbx)
	if owner == nil || owner.Kind != "SandboxClaim" {
		return
	}
	claim, err := o.claims.SandboxClaims(sbx.Namespace).Get(owner.Name)
	if err != nil || claim.UID != owner.UID {
		return
	}
	if ready, _ := claimReady(claim); ready && claim.Status.SandboxStatus.Name == sbx.Name {
		o.countStart(claim, sbx, initial)
	}
}

func (o *Observer) countStart(claim *extv1beta1.SandboxClaim, sbx *sandboxv1beta1.Sandbox, initial bool) {
	o.once(o.started, claim.UID, initial, func() {
		start := JobStart{Pool: claim.Spec.WarmPoolRef.Name, Launch: launchOf(claim, sbx)}
		if c := meta.FindStatusCondition(claim.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady)); c != nil {
			start.ClaimToReady = max(0, c.LastTransitionTime.Sub(claim.CreationTimestamp.Time))
		}
		o.onStart(start)
	})
}

func (o *Observer) countEnd(uid types.UID, pool string, obj metav1.Object, initial bool) {
	outcome := OutcomeOf(obj)
	if outcome.Result == "" {
		return
	}
	o.once(o.ended, uid, initial, func() { o.onEnd(JobEnd{Pool: pool, Outcome: outcome}) })
}

// once calls count the first time uid is seen in seen, unless it is first seen in the
// informer's initial list (the exporter before this one counted it).
func (o *Observer) once(seen map[types.UID]bool, uid types.UID, initial bool, count func()) {
	o.mu.Lock()
	first := !seen[uid]
	seen[uid] = true
	o.mu.Unlock()
	if first && !initial {
		count()
	}
}

// forget drops a deleted object's UID: UIDs are never reused, so the sets stay small.
func (o *Observer) forget(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	o.mu.Lock()
	delete(o.started, m.GetUID())
	delete(o.ended, m.GetUID())
	o.mu.Unlock()
}

func sandboxReady(sbx *sandboxv1beta1.Sandbox) bool {
	return meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady))
}

// Pools is a snapshot of every pool in the namespace, by name, from the informers' caches: what
// the controller reports, and what the exporter works out from the claims and pods (at now).
func (o *Observer) Pools(now time.Time) ([]PoolState, error) {
	pools, err := o.pools.SandboxWarmPools(o.namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	byName := map[string]*PoolState{}
	out := make([]PoolState, len(pools))
	for i, p := range pools {
		out[i] = PoolState{Name: p.Name, Desired: ptrValue(p.Spec.Replicas), Ready: p.Status.ReadyReplicas, Total: p.Status.Replicas}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	for i := range out {
		byName[out[i].Name] = &out[i]
	}
	claims, err := o.claims.SandboxClaims(o.namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	for _, c := range claims {
		p := byName[c.Spec.WarmPoolRef.Name]
		if p == nil {
			continue
		}
		if ready, _ := claimReady(c); ready {
			p.ClaimsReady++
		} else if c.DeletionTimestamp == nil {
			p.ClaimsWaiting++
		}
		if lc := c.Spec.Lifecycle; lc != nil && lc.ShutdownTime != nil && now.After(lc.ShutdownTime.Time) {
			p.ClaimsPastShutdown++
		}
	}
	pods, err := o.pods.Pods(o.namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	for _, pod := range pods {
		if !fenceHoldsOut(pod) {
			continue
		}
		if p := byName[o.poolOfPod(pod)]; p != nil {
			p.FenceHeldOut++
		}
	}
	return out, nil
}

func ptrValue(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

// poolOfPod is the pool a pod's Sandbox belongs to: the pool that owns it while it waits, the
// pool its claim names once claimed; "" for neither.
func (o *Observer) poolOfPod(pod *corev1.Pod) string {
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "Sandbox" {
		return ""
	}
	sbx, err := o.sandboxSet.Sandboxes(pod.Namespace).Get(owner.Name)
	if err != nil {
		return ""
	}
	sbxOwner := metav1.GetControllerOf(sbx)
	switch {
	case sbxOwner == nil:
		return ""
	case sbxOwner.Kind == "SandboxWarmPool":
		return sbxOwner.Name
	case sbxOwner.Kind == "SandboxClaim":
		if claim, err := o.claims.SandboxClaims(pod.Namespace).Get(sbxOwner.Name); err == nil {
			return claim.Spec.WarmPoolRef.Name
		}
	}
	return ""
}

// fenceHoldsOut reports whether the pod runs but is held out of service by its egress fence: a
// container whose only readiness check is the baked-in agent's fence probe (on
// wire.FencePort) is running, started and not ready. The kubelet marks it so while the probe
// fails, that is while the fence does not hold (and for at most a probe period after the
// container starts, which an alert's "for" rides out).
func fenceHoldsOut(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
		return false
	}
	fenced := map[string]bool{}
	for _, c := range pod.Spec.Containers {
		if probe := c.ReadinessProbe; probe != nil && probe.HTTPGet != nil && probe.HTTPGet.Port.IntValue() == wire.FencePort {
			fenced[c.Name] = true
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if fenced[cs.Name] && cs.State.Running != nil && cs.Started != nil && *cs.Started && !cs.Ready {
			return true
		}
	}
	return false
}
