package fakecluster

import (
	"context"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"
	extfake "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned/fake"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Namespace is where the fake cluster keeps its pool, claims, sandboxes and pods.
const Namespace = "sandbox-executor"

// Pool is the fake cluster's warm pool.
const Pool = "duo-default"

// PodIP is the fake pods' address: on loopback, where no agent listens, so the network transport
// is refused at once and falls back to exec, whatever runs on the machine's pod network.
const PodIP = "127.0.0.9"

// Template is the fake cluster's SandboxTemplate, for cold starts.
const Template = "duo-gvisor"

var (
	claimsGVR    = kube.SandboxClaims.WithVersion(kube.APIVersion)
	sandboxesGVR = kube.Sandboxes.WithVersion(kube.APIVersion)
)

// Cluster is the fake clientsets plus a stand-in for the agent-sandbox controller: when a
// claim is watched it binds the claim to a warm sandbox and pod, and when a Sandbox is watched it
// starts the pod of every Sandbox without one, as the real controller does.
type Cluster struct {
	Kube       *kubefake.Clientset
	Sandboxes  *sandboxfake.Clientset
	Extensions *extfake.Clientset
	Clients    *kube.Clients
	// RuntimeClass of the pods the controller hands out; "" for none.
	RuntimeClass string
	// ReadyReason, when set, makes claims and Sandboxes Ready=False with this reason instead of
	// Ready.
	ReadyReason string
	// Launch is how the controller hands out a claim's sandbox, recorded as agent-sandbox records
	// it: kube.LaunchWarm (or "") a pool sandbox Ready since before the claim was made,
	// kube.LaunchWaited a pool sandbox that turned Ready a second after, kube.LaunchCold a
	// sandbox created for the claim.
	Launch kube.Launch
	// AgentBaked gives claimed pods the job container of a template that bakes the agent in.
	AgentBaked bool
	// ClaimStatusLags makes the controller adopt a Ready sandbox for each claim (when claims or
	// Sandboxes are watched) but never write the claim's status: agent-sandbox's status write
	// after an adoption, slowed down to never.
	ClaimStatusLags bool
}

// HardenedTemplate is a SandboxTemplate as the chart (deploy/chart) renders it: gVisor, no token, one job
// container.
func HardenedTemplate() *extv1beta1.SandboxTemplate {
	rc, no := "gvisor", false
	t := &extv1beta1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Name: Template, Namespace: Namespace, UID: "template-uid"}}
	t.Spec.PodTemplate = sandboxv1beta1.PodTemplate{
		ObjectMeta: sandboxv1beta1.PodMetadata{Labels: map[string]string{"app.kubernetes.io/name": "sandbox-executor-job"}},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "job", Image: "ci:bookworm"}}},
	}
	t.Spec.NetworkPolicy = &extv1beta1.NetworkPolicySpec{}
	return t
}

func NewCluster(t testing.TB, objects ...runtime.Object) *Cluster {
	t.Helper()
	replicas := int32(2)
	pool := &extv1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: Pool, Namespace: Namespace},
		Spec:       extv1beta1.SandboxWarmPoolSpec{Replicas: &replicas},
		Status:     extv1beta1.SandboxWarmPoolStatus{ReadyReplicas: 2},
	}
	objects = append([]runtime.Object{pool, HardenedTemplate()}, objects...)
	for _, obj := range objects {
		// As stored by an API server (see stampResourceVersions).
		if m, err := meta.Accessor(obj); err == nil && m.GetResourceVersion() == "" {
			m.SetResourceVersion("1")
		}
	}
	fc := &Cluster{
		Kube:         kubefake.NewSimpleClientset(),
		Sandboxes:    sandboxfake.NewSimpleClientset(),
		Extensions:   extfake.NewSimpleClientset(objects...),
		RuntimeClass: "gvisor",
	}
	stampResourceVersions(&fc.Extensions.Fake, fc.Extensions.Tracker())
	stampResourceVersions(&fc.Sandboxes.Fake, fc.Sandboxes.Tracker())
	reconcileOnWatch(&fc.Extensions.Fake, fc.Extensions.Tracker(), claimsGVR, "SandboxClaim", func() { fc.bindClaims(t) })
	reconcileOnWatch(&fc.Sandboxes.Fake, fc.Sandboxes.Tracker(), sandboxesGVR, "Sandbox", func() {
		if fc.ClaimStatusLags {
			fc.adoptWithoutClaimStatus(t)
		}
		fc.startSandboxes(t)
	})
	fc.Clients = &kube.Clients{Kube: fc.Kube, Sandboxes: fc.Sandboxes, Extensions: fc.Extensions}
	return fc
}

// SetPoolReady sets how many of the pool's sandboxes are ready, as the pool's controller reports.
func (fc *Cluster) SetPoolReady(t testing.TB, ready int32) {
	t.Helper()
	pools := fc.Extensions.ExtensionsV1beta1().SandboxWarmPools(Namespace)
	pool, err := pools.Get(context.Background(), Pool, metav1.GetOptions{})
	if err == nil {
		pool.Status.ReadyReplicas = ready
		_, err = pools.UpdateStatus(context.Background(), pool, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Errorf("pool status: %v", err)
	}
}

// Claimer is a kube.Claimer of the fake cluster, dated by a fake clock at Now.
func (fc *Cluster) Claimer() *kube.Claimer {
	return kube.NewClaimer(fc.Clients, testingclock.NewFakePassiveClock(Now))
}

// JobLog is a job log writing to w (nil for nowhere), dated by a fake clock at Now.
func JobLog(w io.Writer) *gitlab.JobLog {
	return gitlab.NewJobLog(w, false, testingclock.NewFakePassiveClock(Now))
}

// Now is the fake cluster's time, for claimers that need not control it.
var Now = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

// stampResourceVersions gives every object created or updated through fake a resourceVersion, as
// the API server does: the fake tracker keeps objects' own empty, and client-go's RetryWatcher,
// which kube's waits use, cannot start from an empty one or resume past an event without one.
func stampResourceVersions(fake *k8stesting.Fake, tracker k8stesting.ObjectTracker) {
	var version atomic.Int64
	fake.PrependReactor("*", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetVerb() != "create" && action.GetVerb() != "update" {
			return false, nil, nil
		}
		// Stamp a copy: the caller's object stays as it was.
		action = action.DeepCopy()
		obj, err := meta.Accessor(action.(interface{ GetObject() runtime.Object }).GetObject())
		if err != nil {
			return false, nil, nil
		}
		v := version.Add(1)
		obj.SetResourceVersion(strconv.FormatInt(v, 10))
		if action.GetVerb() == "create" && obj.GetUID() == "" {
			obj.SetUID(types.UID("uid-" + strconv.FormatInt(v, 10)))
		}
		if action.GetVerb() == "create" && obj.GetCreationTimestamp().Time.IsZero() {
			obj.SetCreationTimestamp(metav1.NewTime(Now))
		}
		return k8stesting.ObjectReaction(tracker)(action)
	})
}

// reconcileOnWatch serves watches of gvr from the fake's tracker and runs the fake controller's
// reconcile alongside each, so that its updates reach the watcher.
func reconcileOnWatch(fake *k8stesting.Fake, tracker k8stesting.ObjectTracker, gvr schema.GroupVersionResource, kind string, reconcile func()) {
	fake.PrependWatchReactor(gvr.Resource, func(action k8stesting.Action) (bool, watch.Interface, error) {
		w, err := tracker.Watch(gvr, action.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		if wa, ok := action.(k8stesting.WatchAction); ok && wa.GetWatchRestrictions().ResourceVersion == "" {
			// As the API server starts a watch without a resourceVersion: the objects there
			// now first, as ADDED events (the fake tracker sends only later changes).
			if w, err = withInitialEvents(w, tracker, gvr, kind, action.GetNamespace()); err != nil {
				return true, nil, err
			}
		}
		go reconcile()
		return true, w, nil
	})
}

// withInitialEvents is w preceded by an ADDED event for every object of gvr (of kind) in namespace.
func withInitialEvents(w watch.Interface, tracker k8stesting.ObjectTracker, gvr schema.GroupVersionResource, kind, namespace string) (watch.Interface, error) {
	list, err := tracker.List(gvr, gvr.GroupVersion().WithKind(kind), namespace)
	if err != nil {
		return nil, err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	events := make(chan watch.Event)
	proxy := watch.NewProxyWatcher(events)
	go func() {
		defer close(events)
		defer w.Stop()
		send := func(ev watch.Event) bool {
			select {
			case events <- ev:
				return true
			case <-proxy.StopChan():
				return false
			}
		}
		for _, item := range items {
			if !send(watch.Event{Type: watch.Added, Object: item}) {
				return
			}
		}
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok || !send(ev) {
					return
				}
			case <-proxy.StopChan():
				return
			}
		}
	}()
	return proxy, nil
}

// bindClaims makes every unbound claim Ready on a warm sandbox (with ClaimStatusLags: adopts
// one for it, as the real controller does whether or not anyone watches Sandboxes).
func (fc *Cluster) bindClaims(t testing.TB) {
	if fc.ClaimStatusLags {
		fc.adoptWithoutClaimStatus(t)
		return
	}
	ctx := context.Background()
	claims, err := fc.Extensions.ExtensionsV1beta1().SandboxClaims(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("fake controller: %v", err)
		return
	}
	for i := range claims.Items {
		claim := &claims.Items[i]
		if claim.Status.SandboxStatus.Name != "" {
			continue
		}
		if claim.CreationTimestamp.IsZero() {
			// As the API server stamps it; the fake tracker does not.
			claim.CreationTimestamp = metav1.NewTime(Now)
		}
		cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "DependenciesReady"}
		if fc.ReadyReason != "" {
			cond = metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: fc.ReadyReason, Message: "waiting for " + fc.ReadyReason}
		} else {
			name := fc.warmSandboxName(claim)
			fc.addClaimedSandbox(t, claim, name)
			claim.Status.SandboxStatus.Name = name
		}
		claim.Status.Conditions = []metav1.Condition{cond}
		// A claim may be gone by now: prepare can go on from the adoption, before this status
		// write, and a test may release the claim meanwhile.
		if _, err := fc.Extensions.ExtensionsV1beta1().SandboxClaims(Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("fake controller: %v", err)
		}
	}
}

// adoptWithoutClaimStatus gives every claim its sandbox (ClaimStatusLags).
func (fc *Cluster) adoptWithoutClaimStatus(t testing.TB) {
	claims, err := fc.Extensions.ExtensionsV1beta1().SandboxClaims(Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Errorf("fake controller: %v", err)
		return
	}
	for i := range claims.Items {
		fc.addClaimedSandbox(t, &claims.Items[i], fc.warmSandboxName(&claims.Items[i]))
	}
}

// warmSandboxName is the warm sandbox the fake controller gives claim: Pool-abcde, unless another
// claim holds that one (two jobs at once), then Pool-abcde1, Pool-abcde2, ...
func (fc *Cluster) warmSandboxName(claim *extv1beta1.SandboxClaim) string {
	for i := 0; ; i++ {
		name := Pool + "-abcde"
		if i > 0 {
			name += strconv.Itoa(i)
		}
		sbx, err := fc.Sandboxes.AgentsV1beta1().Sandboxes(Namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || slices.ContainsFunc(sbx.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == claim.UID }) {
			return name
		}
	}
}

// addClaimedSandbox gives claim its Ready sandbox and pod, launched as fc.Launch says: the
// launch-type label and the Sandbox's Ready time against the claim's creation.
func (fc *Cluster) addClaimedSandbox(t testing.TB, claim *extv1beta1.SandboxClaim, name string) {
	ctx := context.Background()
	launch, readySince := sandboxv1beta1.SandboxLaunchTypeWarm, claim.CreationTimestamp.Add(-time.Minute)
	switch fc.Launch {
	case kube.LaunchWaited:
		readySince = claim.CreationTimestamp.Add(time.Second)
	case kube.LaunchCold:
		launch, readySince = sandboxv1beta1.SandboxLaunchTypeCold, claim.CreationTimestamp.Add(time.Second)
	}
	// As agent-sandbox's adoption leaves it: controlled by the claim and labelled with its UID.
	isController := true
	sandbox := &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: Namespace,
		Labels:          map[string]string{sandboxv1beta1.SandboxLaunchTypeLabel: launch, extv1beta1.SandboxIDLabel: string(claim.UID)},
		Annotations:     map[string]string{sandboxv1beta1.SandboxPodNameAnnotation: name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "extensions.agents.x-k8s.io/v1beta1", Kind: "SandboxClaim", Name: claim.Name, UID: claim.UID, Controller: &isController}},
	}}
	sandbox.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "DependenciesReady", LastTransitionTime: metav1.NewTime(readySince)}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{extv1beta1.SandboxIDLabel: string(claim.UID)}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "job", Image: "ci:bookworm"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: PodIP},
	}
	if fc.RuntimeClass != "" {
		pod.Spec.RuntimeClassName = &fc.RuntimeClass
	}
	if fc.AgentBaked {
		pod.Spec.Containers[0].Command = []string{wire.PodAgentPath, "serve"}
	}
	// The pod first: a Sandbox is Ready only once its pod is.
	if _, err := fc.Kube.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Errorf("fake controller: %v", err)
	}
	if _, err := fc.Sandboxes.AgentsV1beta1().Sandboxes(Namespace).Create(ctx, sandbox, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Errorf("fake controller: %v", err)
	}
}

// startSandboxes gives every Sandbox without a Ready condition its pod, controlled by the
// Sandbox and labelled from its pod template (the template ref-hash label from the Sandbox's own
// labels, as the real controller does for Sandboxes controlled by extensions objects), and makes
// it Ready. The fake clientsets set no UIDs: it gives the Sandbox one.
func (fc *Cluster) startSandboxes(t testing.TB) {
	ctx := context.Background()
	sandboxes := fc.Sandboxes.AgentsV1beta1().Sandboxes(Namespace)
	list, err := sandboxes.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("fake controller: %v", err)
		return
	}
	for i := range list.Items {
		sbx := &list.Items[i]
		if len(sbx.Status.Conditions) > 0 || sbx.Annotations[sandboxv1beta1.SandboxPodNameAnnotation] != "" {
			continue // started already, or a claim's warm sandbox
		}
		cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "DependenciesReady"}
		if fc.ReadyReason != "" {
			cond = metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: fc.ReadyReason, Message: "waiting for " + fc.ReadyReason}
		} else {
			sbx.UID = types.UID("uid-" + sbx.Name)
			labels := map[string]string{sandboxv1beta1.SandboxTemplateRefHashLabel: sbx.Labels[sandboxv1beta1.SandboxTemplateRefHashLabel]}
			maps.Copy(labels, sbx.Spec.PodTemplate.ObjectMeta.Labels)
			isController := true
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: sbx.Name, Namespace: Namespace, Labels: labels, OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: sbx.Name, UID: sbx.UID, Controller: &isController}}},
				Spec:   *sbx.Spec.PodTemplate.Spec.DeepCopy(),
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: PodIP},
			}
			pod.Spec.RuntimeClassName = nil
			if fc.RuntimeClass != "" {
				pod.Spec.RuntimeClassName = &fc.RuntimeClass
			}
			if _, err := fc.Kube.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Errorf("fake controller: %v", err)
			}
		}
		// One write: the fake's watches do not replay what happened between two of them.
		sbx.Status.Conditions = []metav1.Condition{cond}
		if _, err := sandboxes.UpdateStatus(ctx, sbx, metav1.UpdateOptions{}); err != nil {
			t.Errorf("fake controller: %v", err)
		}
	}
}

// WaitClaimStatus waits until the fake controller has written the named claim's status. Claim
// goes on from the adoption, which the fake controller makes just before that write: a test that
// counts the calls after a Claim must not count the controller's.
func (fc *Cluster) WaitClaimStatus(t testing.TB, name string) {
	t.Helper()
	claims := fc.Extensions.ExtensionsV1beta1().SandboxClaims(Namespace)
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		claim, err := claims.Get(ctx, name, metav1.GetOptions{})
		return err == nil && len(claim.Status.Conditions) > 0, nil
	}); err != nil {
		t.Fatalf("the fake controller wrote no status on claim %s", name)
	}
}
