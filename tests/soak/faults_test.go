//go:build soak

package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

// The fault kinds. Targeted ones hit one job's pod, chosen when the fault fires among the pods
// claimed at that moment (a job in prepare, a stage or cleanup), or, with none then, the next
// one (pickPod); the others hit every job in flight.
const (
	faultAgentKill      = "agent-kill"         // SIGKILL the stage daemon in a job pod
	faultStreamReset    = "stream-reset"       // RST the stage transport of a job pod (iptables REJECT), 5-40 s
	faultStreamDrop     = "stream-drop"        // silently DROP it, 5-40 s
	faultPodDelete      = "pod-delete"         // delete a job pod
	faultPodEvict       = "pod-evict"          // evict a job pod (the Eviction API)
	faultRunnerKill     = "runner-kill"        // kill the runner pod (gitlab-runner and the stage server), 1 s grace
	faultAPIServerKill  = "apiserver-kill"     // SIGKILL kube-apiserver, start it 2-8 s later
	faultControllerKill = "controller-restart" // delete the agent-sandbox controller's pod
	faultPolicyAgent    = "policy-restart"     // kube-router down with its rules removed, 1-3 s, then up
	faultPoolScale      = "pool-scale"         // the warm pool scaled to 0 for 5-20 s, then back
)

var faultKinds = []string{faultAgentKill, faultStreamReset, faultStreamDrop, faultPodDelete, faultPodEvict,
	faultRunnerKill, faultAPIServerKill, faultControllerKill, faultPolicyAgent, faultPoolScale}

func targeted(kind string) bool {
	switch kind {
	case faultAgentKill, faultStreamReset, faultStreamDrop, faultPodDelete, faultPodEvict:
		return true
	}
	return false
}

// settle is how long after a fault is mended its effects may still be felt (watches coming
// back, a pool refilling): a job in flight until then counts as hit.
const settle = 30 * time.Second

// fault is one fault of the schedule and, once fired, what it hit.
type fault struct {
	index int
	kind  string
	at    time.Duration // from the start of the run
	hold  time.Duration // how long it lasts, for the kinds that last
	pick  uint64        // chooses the target among the pods claimed when it fires

	begin, end time.Time
	target     string        // pod
	jobID      int64         // the target's job, for targeted faults
	waited     time.Duration // how long a targeted fault waited for a job pod (none at its moment)
	skipped    string        // why it did not fire (the run ended first)
	err        error
}

func (f *fault) String() string {
	s := fmt.Sprintf("fault %d %s at +%s", f.index, f.kind, f.at.Round(time.Millisecond))
	if f.hold > 0 {
		s += fmt.Sprintf(" for %s", f.hold.Round(time.Millisecond))
	}
	switch {
	case f.skipped != "":
		s += ": skipped, " + f.skipped
	case f.target != "":
		s += fmt.Sprintf(": pod %s (job %d)", f.target, f.jobID)
	}
	if w := f.waited.Round(time.Millisecond); w > 0 {
		s += fmt.Sprintf(", after waiting %s for a job pod", w)
	}
	if f.err != nil {
		s += fmt.Sprintf(": ERROR %v", f.err)
	}
	return s
}

// hits tells whether the fault may have touched job s (in flight from handed to finished).
func (f *fault) hits(s *soakJob, handed, finished time.Time) bool {
	if f.begin.IsZero() || f.skipped != "" {
		return false
	}
	if targeted(f.kind) {
		return f.jobID == s.id
	}
	if finished.IsZero() {
		finished = time.Now()
	}
	return !handed.After(f.end.Add(settle)) && !finished.Before(f.begin)
}

// schedule draws n faults over span, their kinds, holds and targets.
func schedule(rng *rand.Rand, n int, span time.Duration) []*fault {
	faults := make([]*fault, n)
	for i := range faults {
		f := &fault{kind: faultKinds[rng.IntN(len(faultKinds))], at: 5*time.Second + time.Duration(rng.Int64N(int64(span))), pick: rng.Uint64()}
		switch f.kind {
		case faultStreamReset, faultStreamDrop:
			f.hold = 5*time.Second + time.Duration(rng.Int64N(int64(35*time.Second)))
		case faultAPIServerKill:
			f.hold = 2*time.Second + time.Duration(rng.Int64N(int64(6*time.Second)))
		case faultPolicyAgent:
			f.hold = time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
		case faultPoolScale:
			f.hold = 5*time.Second + time.Duration(rng.Int64N(int64(15*time.Second)))
		}
		faults[i] = f
	}
	// In time order, numbered so.
	for i := range faults {
		for j := i + 1; j < len(faults); j++ {
			if faults[j].at < faults[i].at {
				faults[i], faults[j] = faults[j], faults[i]
			}
		}
	}
	for i, f := range faults {
		f.index = i + 1
	}
	return faults
}

// injector fires the schedule on the release: each fault at its time in its own goroutine, so
// faults of different kinds overlap; two of one kind never do (one waits for the other, also
// while the first waits for a job pod).
type injector struct {
	r      *chartinstall.Release
	admin  *kube.Clients
	pool   string
	logf   func(format string, args ...any)
	perKnd map[string]*sync.Mutex
	// runnerKilled is told the time each runner kill completed.
	runnerKilled func(at time.Time)

	// targets are the pods of targeted faults under way: another targeted fault picks among the
	// other job pods, so that two faults waiting for a job pod do not hit the first one together
	// (a pod-delete would leave an agent-kill nothing to kill).
	targetsMu sync.Mutex
	targets   map[string]bool
}

// run fires faults from start until ctx ends. jobsCtx ends when every job has settled: a
// targeted fault waiting for a job pod then gives up (no job pod will run again).
func (in *injector) run(ctx, jobsCtx context.Context, start time.Time, faults []*fault) *sync.WaitGroup {
	in.perKnd = map[string]*sync.Mutex{}
	in.targets = map[string]bool{}
	for _, k := range faultKinds {
		in.perKnd[k] = &sync.Mutex{}
	}
	var wg sync.WaitGroup
	for _, f := range faults {
		wg.Go(func() {
			select {
			case <-time.After(time.Until(start.Add(f.at))):
			case <-ctx.Done():
				f.skipped = "the run ended first"
				return
			}
			mu := in.perKnd[f.kind]
			mu.Lock()
			defer mu.Unlock()
			f.err = in.fire(ctx, jobsCtx, f)
			in.logf("%s (%s to %s)", f, f.begin.Format("15:04:05.000"), f.end.Format("15:04:05.000"))
		})
	}
	return &wg
}

// fire fires f, a targeted one on the pod pickPod waits for until jobsCtx ends.
func (in *injector) fire(ctx, jobsCtx context.Context, f *fault) error {
	ns := in.r.Namespace
	if targeted(f.kind) {
		pod, err := in.pickPod(ctx, jobsCtx, f)
		if err != nil || pod == nil {
			return err
		}
		defer func() {
			in.targetsMu.Lock()
			delete(in.targets, pod.Name)
			in.targetsMu.Unlock()
		}()
		f.target = pod.Name
		f.begin = time.Now()
		defer func() { f.end = time.Now() }()
		switch f.kind {
		case faultAgentKill:
			_, err := in.r.Kubectl("-n", ns, "exec", pod.Name, "--", "sh", "-c", "kill -9 $(cat "+wire.BaseDir+"/daemon.pid)")
			return err
		case faultStreamReset, faultStreamDrop:
			return cutStream(ctx, pod.Status.PodIP, f.kind == faultStreamDrop, f.hold)
		case faultPodDelete:
			return in.admin.Kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{})
		case faultPodEvict:
			return in.admin.Kube.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: ns}})
		}
		return fmt.Errorf("unknown targeted fault %s", f.kind)
	}
	f.begin = time.Now()
	defer func() { f.end = time.Now() }()
	switch f.kind {
	case faultRunnerKill:
		// Not forced: the pod is gone from the API only once the kubelet has killed it, so
		// every job it held is lost when this returns.
		pods, err := in.runnerPods(ctx)
		if err != nil {
			return err
		}
		for _, p := range pods {
			f.target = p
			if _, err := in.r.Kubectl("-n", ns, "delete", "pod", p, "--grace-period=1", "--wait=true", "--timeout=2m"); err != nil {
				return err
			}
		}
		in.runnerKilled(time.Now())
		return nil
	case faultAPIServerKill:
		if err := clusterjobs.RunScript("start.sh", "kill", "apiserver"); err != nil {
			return err
		}
		sleep(ctx, f.hold)
		return clusterjobs.RunScript("start.sh", "start", "apiserver")
	case faultControllerKill:
		return retry(ctx, func() error {
			_, err := in.r.Kubectl("-n", "agent-sandbox-system", "delete", "pod", "-l", "app=agent-sandbox-controller", "--wait=false")
			return err
		})
	case faultPolicyAgent:
		if err := clusterjobs.RunScript("networkpolicy.sh", "enforcement-down"); err != nil {
			return err
		}
		sleep(ctx, f.hold)
		return clusterjobs.RunScript("networkpolicy.sh", "up")
	case faultPoolScale:
		pools := in.admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(ns)
		var replicas int32
		if err := retry(ctx, func() error {
			p, err := pools.Get(ctx, in.pool, metav1.GetOptions{})
			if err == nil {
				replicas = ptr.Deref(p.Spec.Replicas, poolReplicas)
			}
			return err
		}); err != nil {
			return err
		}
		scale := func(n int32) error {
			// Not ctx: the pool is scaled back even when the run is cut short.
			return retry(context.Background(), func() error {
				_, err := in.r.Kubectl("-n", ns, "patch", "sandboxwarmpool", in.pool, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"replicas":%d}}`, n))
				return err
			})
		}
		if err := scale(0); err != nil {
			return err
		}
		sleep(ctx, f.hold)
		// Back even when the run is over: the cluster is left whole.
		return scale(replicas)
	}
	return fmt.Errorf("unknown fault %s", f.kind)
}

// jobPodSelector selects the release's job pods that have left the warm pool: a claimed pod
// loses the pool's label (agent-sandbox v0.5.6 puts no claim label on it).
const jobPodSelector = "app.kubernetes.io/name=sandbox-executor-job,!agents.x-k8s.io/warm-pool-sandbox"

// pickPod chooses the fault's target among the job pods of claims now, each found by its
// Sandbox (named like the pod) and that Sandbox's controlling claim, which names the job. With
// none now, it waits for the next such pod and records how long in f.waited: a targeted fault
// fires on a job, or says why not. When jobsCtx ends first (every job has settled, none will run
// again) the fault is skipped.
//
// It waits by looking again every second, not by a watch: a pod turns eligible by a change to
// the pod (claimed, its job container started) or to its Sandbox alone (a warm Sandbox taken by
// a claim), so a watch would need pods and Sandboxes both, and the lists again on each event.
// Three small lists a second in one namespace cost the cluster little, the poll rides out an
// API server fault as the lists' retry does, and a second late is small beside a job's life.
func (in *injector) pickPod(ctx, jobsCtx context.Context, f *fault) (*corev1.Pod, error) {
	var pod *corev1.Pod
	var none time.Time // the first look that found no job pod
	// The looks take ctx, the fault's: the first one happens even when jobsCtx has ended, as
	// before, and a look under way finishes; jobsCtx only ends the wait.
	err := wait.PollUntilContextCancel(jobsCtx, time.Second, true, func(context.Context) (bool, error) {
		pods, jobOf, err := in.jobPods(ctx)
		if err != nil {
			return false, err
		}
		in.targetsMu.Lock()
		defer in.targetsMu.Unlock()
		pods = slices.DeleteFunc(pods, func(p corev1.Pod) bool { return in.targets[p.Name] })
		if len(pods) == 0 {
			if none.IsZero() {
				none = time.Now()
			}
			return false, nil
		}
		pod = &pods[f.pick%uint64(len(pods))]
		f.jobID = jobOf[pod.Name]
		in.targets[pod.Name] = true // until fire's end
		return true, nil
	})
	if !none.IsZero() {
		f.waited = time.Since(none)
	}
	switch {
	case pod != nil:
		return pod, nil
	case jobsCtx.Err() != nil && errors.Is(err, jobsCtx.Err()):
		f.skipped = "the run ended before a job pod ran"
		return nil, nil
	}
	return nil, err
}

// jobPods are the job pods of claims now (not being deleted, with an address and their job
// container running) and the job of each by pod name. API errors are retried for a minute.
func (in *injector) jobPods(ctx context.Context) ([]corev1.Pod, map[string]int64, error) {
	ns := in.r.Namespace
	var pods []corev1.Pod
	jobOf := map[string]int64{} // by pod (Sandbox) name
	err := retry(ctx, func() error {
		list, err := in.admin.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: jobPodSelector})
		if err != nil {
			return err
		}
		claims, err := in.admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		sandboxes, err := in.admin.Sandboxes.AgentsV1beta1().Sandboxes(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		jobOfClaim := map[string]int64{}
		for _, c := range claims.Items {
			jobOfClaim[c.Name], _ = strconv.ParseInt(c.Labels[kube.LabelJobID], 10, 64)
		}
		clear(jobOf)
		for _, sb := range sandboxes.Items {
			if ref := metav1.GetControllerOf(&sb); ref != nil && ref.Kind == "SandboxClaim" {
				jobOf[sb.Name] = jobOfClaim[ref.Name]
			}
		}
		pods = nil
		for _, p := range list.Items {
			// The job container runs, so a fault on the pod hits the job's agent and stream (a
			// cold pod has its address while its init containers still run). Not Ready: under
			// the soak's load the 1 s readiness probe fails now and then on busy job pods.
			if p.DeletionTimestamp == nil && p.Status.PodIP != "" && jobOf[p.Name] != 0 && jobContainerRunning(&p) {
				pods = append(pods, p)
			}
		}
		return nil
	})
	return pods, jobOf, err
}

// jobContainerRunning says whether the pod's job container (the agent's) is running.
func jobContainerRunning(p *corev1.Pod) bool {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == "job" {
			return c.State.Running != nil
		}
	}
	return false
}

// runnerPods are the runner Deployment's pods.
func (in *injector) runnerPods(ctx context.Context) ([]string, error) {
	var names []string
	err := retry(ctx, func() error {
		d, err := in.admin.Kube.AppsV1().Deployments(in.r.Namespace).Get(ctx, in.r.Fullname()+"-runner", metav1.GetOptions{})
		if err != nil {
			return err
		}
		list, err := in.admin.Kube.CoreV1().Pods(in.r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.Set(d.Spec.Selector.MatchLabels).String()})
		if err != nil {
			return err
		}
		names = nil
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				names = append(names, p.Name)
			}
		}
		return nil
	})
	return names, err
}

// cutStream breaks the stage transport (the agent's ports) of the pod at ip for hold: RST to
// every packet (filter FORWARD REJECT) or a silent DROP (raw PREROUTING, before the policy
// agent accepts established connections), both ways, then mends it.
func cutStream(ctx context.Context, ip string, drop bool, hold time.Duration) error {
	ports := fmt.Sprintf("%d,%d", wire.NetworkPort, wire.FencePort)
	var rules [][]string
	if drop {
		rules = [][]string{
			{"PREROUTING", "-t", "raw", "-s", ip, "-p", "tcp", "-m", "multiport", "--sports", ports, "-j", "DROP"},
			{"PREROUTING", "-t", "raw", "-d", ip, "-p", "tcp", "-m", "multiport", "--dports", ports, "-j", "DROP"},
		}
	} else {
		rules = [][]string{
			{"FORWARD", "-s", ip, "-p", "tcp", "-m", "multiport", "--sports", ports, "-j", "REJECT", "--reject-with", "tcp-reset"},
			{"FORWARD", "-d", ip, "-p", "tcp", "-m", "multiport", "--dports", ports, "-j", "REJECT", "--reject-with", "tcp-reset"},
		}
	}
	mend := func() {
		for _, rule := range rules {
			for exec.Command("iptables", append([]string{"-w", "5", "-D"}, rule...)...).Run() == nil {
			}
		}
	}
	defer mend()
	for _, rule := range rules {
		if out, err := exec.Command("iptables", append([]string{"-w", "5", "-I"}, rule...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables -I %s: %v %s", strings.Join(rule, " "), err, out)
		}
	}
	sleep(ctx, hold)
	return nil
}

// retry tries call for up to a minute: the API server may be down for a fault of another kind.
func retry(ctx context.Context, call func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		last = call()
		return last == nil, nil
	})
	if err != nil && last != nil {
		return last
	}
	return err
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// supervisedDaemons are the local cluster's control-plane daemons that run on this machine with
// nothing to restart them (a real cluster's kubelet or systemd would): kube-scheduler exits on
// purpose when it finds its cache corrupted, which an API server killed mid-watch can cause.
// kube-apiserver is left to its fault, which starts it again.
var supervisedDaemons = []string{"etcd", "controller-manager", "scheduler"}

// supervise starts, every few seconds until ctx ends, whichever of supervisedDaemons has
// exited, as a supervisor would, and reports each restart: the report names them.
func supervise(ctx context.Context, restarted func(daemon string)) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(3 * time.Second):
			}
			for _, d := range supervisedDaemons {
				out, err := clusterjobs.ClusterScript(context.Background(), "start.sh", nil, "start", d)
				if err == nil && strings.Contains(out, "started ") {
					restarted(d)
				}
			}
		}
	})
	return &wg
}
