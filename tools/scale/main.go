// Command scale measures SandboxClaim latency at scale against the real kube-apiserver, etcd,
// scheduler and agent-sandbox controller of the local cluster, with kwok playing the nodes
// (tools/scale/kwok.sh up). Run it through `make bench-scale`.
//
// Each round fires N claims at once, each through the executor's own claim path
// (kube.Claimer.Claim: create, a watch on that one claim, then Resolve's two GETs and its
// fail-closed pod check), each on its own API server connection as N separate `prepare`
// processes would be. A separate single watch on all claims of the namespace records when each
// claim turned Ready as the API server published it: that is the control plane's latency, the
// Claim() figure adds the client's share. Nothing is polled while measuring.
//
// Warm rounds pre-fill the pool with N sandboxes and wait until it is Ready; the pool refills
// while the claims are adopting (as in production), so refill traffic races the burst. Cold
// rounds use a pool of 0: every claim creates its Sandbox and pod, which the real scheduler
// binds to a kwok node and kwok marks Running.
//
// The agent-sandbox controller is the cluster's own, in-cluster Deployment. With -controller-flags
// the rounds run once per setting: the Deployment's args are changed, the bench waits for the
// rollout and the new pod's leadership, and the original args are always put back (and waited for)
// before it exits; they are recorded on the Deployment meanwhile, so a run killed before restoring
// is undone by the next.
//
// The pods carry runtimeClassName gvisor like production pods (the RuntimeClass has no
// scheduling constraint, and kwok never runs them), so the executor's check passes unchanged.
// Everything lives in its own namespace, created at start and deleted (and waited for) at the end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxclient "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned"
	extclient "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// What kwok.sh puts on its fake nodes.
const (
	kwokNodeLabel = "sandbox-executor.local/kwok"
	kwokTaintKey  = "kwok.x-k8s.io/node"
)

const (
	poolName   = "scale"
	runnerName = "scale-bench"
	// ownerLabel marks the namespace as this tool's, so a leftover from an aborted run may be
	// deleted and nothing else ever is.
	ownerLabel = "sandbox-executor.local/scale-bench"
)

type options struct {
	kubeconfig   string
	namespace    string
	out          string
	warm, cold   []int
	qps          float64
	burst        int
	roundTimeout time.Duration
	clusterDir   string
	// controller is the agent-sandbox controller's Deployment, namespace/name.
	controller string
	// settings are the controller flags to run the rounds with, one entry per setting; nil runs
	// them once with the controller as found.
	settings [][]string
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func parseFlags() (*options, error) {
	dir, err := localcluster.ClusterDir()
	if err != nil {
		return nil, err
	}
	o := &options{clusterDir: dir}
	var warm, cold string
	flag.StringVar(&o.kubeconfig, "kubeconfig", filepath.Join(dir, "kubeconfig", "admin.kubeconfig"), "admin kubeconfig of the cluster")
	flag.StringVar(&o.namespace, "namespace", "sandbox-scale", "namespace to create, use and delete")
	flag.StringVar(&o.out, "out", "", "also write the markdown tables to this file")
	flag.StringVar(&warm, "warm", "100,500,1000", "comma-separated claim counts for warm rounds (pool pre-filled to N)")
	flag.StringVar(&cold, "cold", "100", "comma-separated claim counts for cold rounds (pool of 0); empty for none")
	flag.Float64Var(&o.qps, "qps", 10000, "client QPS per claimer connection (high: the client must not be the limit)")
	flag.IntVar(&o.burst, "burst", 10000, "client burst per claimer connection")
	flag.DurationVar(&o.roundTimeout, "round-timeout", 15*time.Minute, "limit for each phase of a round (pool fill, claims, cleanup)")
	flag.StringVar(&o.controller, "controller", "agent-sandbox-system/agent-sandbox-controller", "the agent-sandbox controller's Deployment, namespace/name")
	flag.Func("controller-flags", "run the rounds with these controller flags (--name=value ..., replacing the same flags of its args; '' for the args as found); repeat for several settings, each rolled out in turn, the original args restored at the end", func(v string) error {
		args, err := parseSetting(v)
		o.settings = append(o.settings, args)
		return err
	})
	flag.Parse()
	if flag.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(flag.Args(), " "))
	}
	if o.warm, err = parseCounts("warm", warm); err != nil {
		return nil, err
	}
	if o.cold, err = parseCounts("cold", cold); err != nil {
		return nil, err
	}
	if _, _, err := parseDeployment(o.controller); err != nil {
		return nil, err
	}
	if len(o.warm)+len(o.cold) == 0 {
		return nil, errors.New("nothing to do: -warm and -cold are both empty")
	}
	return o, nil
}

func parseCounts(name, s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 5000 {
			return nil, fmt.Errorf("-%s: %q is not a claim count between 1 and 5000", name, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// bench holds the admin clients (setup, the Ready watch, cleanup) and the results.
type bench struct {
	o    *options
	cfg  *rest.Config
	kube kubernetes.Interface
	sbx  sandboxclient.Interface
	ext  extclient.Interface
	rows []result
	// nodes is the number of Ready kwok nodes.
	nodes int
	ctrl  *controller
	// priorityLevel is the API priority and fairness level of the controller's requests.
	priorityLevel string
	// ownNamespace: the namespace is this tool's (labelled by it), so teardown may delete it.
	ownNamespace bool
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", o.kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	cfg.UserAgent = "sandbox-executor-scale"
	b := &bench{o: o, cfg: cfg}
	if b.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if b.sbx, err = sandboxclient.NewForConfig(cfg); err != nil {
		return err
	}
	if b.ext, err = extclient.NewForConfig(cfg); err != nil {
		return err
	}
	// Ctrl-C or SIGTERM ends the rounds, never the cleanup; a second one kills.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }()
	if err := b.checkNodes(ctx); err != nil {
		return err
	}
	namespace, name, _ := parseDeployment(o.controller)
	if b.ctrl, err = findController(ctx, b.kube, namespace, name); err != nil {
		return err
	}
	runErr := b.setup(ctx)
	if runErr == nil {
		if b.priorityLevel, err = priorityLevel(ctx, cfg, b.kube, namespace, b.ctrl.serviceAccount, o.namespace); err != nil {
			logf("cannot tell the controller's API priority level: %v", err)
		}
		runErr = b.settings(ctx)
	}
	// Always leave the controller as found and nothing behind, even after a failed or
	// interrupted round; never touch a namespace that is not ours.
	if err := b.ctrl.restore(ctx); err != nil {
		runErr = errors.Join(runErr, err)
	}
	if !b.ownNamespace {
		return runErr
	}
	if err := b.teardown(context.Background()); err != nil {
		runErr = errors.Join(runErr, err)
	}
	report := b.report()
	fmt.Print(report)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report), 0o644); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	return runErr
}

// settingList is the controller settings to run: those asked for, or the controller as found.
func (b *bench) settingList() [][]string {
	if b.o.settings == nil {
		return [][]string{nil}
	}
	return b.o.settings
}

// settings runs the rounds once per controller setting.
func (b *bench) settings(ctx context.Context) error {
	round := 0
	for i, extra := range b.settingList() {
		if err := b.ctrl.apply(ctx, extra); err != nil {
			return err
		}
		if err := b.rounds(ctx, i, &round); err != nil {
			return err
		}
	}
	return nil
}

// rounds runs the warm and cold rounds of one controller setting; round numbers the rounds of
// the whole run (claim names derive from it).
func (b *bench) rounds(ctx context.Context, setting int, round *int) error {
	for _, kind := range []struct {
		warm   bool
		counts []int
	}{{true, b.o.warm}, {false, b.o.cold}} {
		for _, n := range kind.counts {
			*round++
			r, err := b.round(ctx, *round, n, kind.warm)
			if r != nil {
				r.setting = setting
				b.rows = append(b.rows, *r)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *bench) checkNodes(ctx context.Context) error {
	nodes, err := b.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: kwokNodeLabel + "=true"})
	if err != nil {
		return err
	}
	ready := 0
	for _, n := range nodes.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready++
			}
		}
	}
	if ready == 0 {
		return errors.New("no Ready kwok nodes: start them with tools/scale/kwok.sh up")
	}
	logf("%d kwok nodes Ready", ready)
	b.nodes = ready
	return nil
}

func (b *bench) setup(ctx context.Context) error {
	nss := b.kube.CoreV1().Namespaces()
	if old, err := nss.Get(ctx, b.o.namespace, metav1.GetOptions{}); err == nil {
		if old.Labels[ownerLabel] != "true" {
			return fmt.Errorf("namespace %s exists and is not ours (no label %s=true): pick another -namespace", b.o.namespace, ownerLabel)
		}
		b.ownNamespace = true
		logf("deleting namespace %s left by an earlier run", b.o.namespace)
		if err := b.deleteNamespace(ctx); err != nil {
			return err
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.o.namespace, Labels: map[string]string{ownerLabel: "true"}}}
	if _, err := nss.Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return err
	}
	b.ownNamespace = true
	tmpl := &extv1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: poolName, Namespace: b.o.namespace},
		Spec: extv1beta1.SandboxTemplateSpec{
			// No NetworkPolicy: kwok pods have no network, and a managed policy would only make
			// the node's policy agent track thousands of fake pods.
			NetworkPolicyManagement: extv1beta1.NetworkPolicyManagementUnmanaged,
			EnvVarsInjectionPolicy:  extv1beta1.EnvVarsInjectionPolicyDisallowed,
			SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{PodTemplate: sandboxv1beta1.PodTemplate{
				ObjectMeta: sandboxv1beta1.PodMetadata{Labels: map[string]string{ownerLabel: "true"}},
				Spec:       podSpec(),
			}},
		},
	}
	if _, err := b.ext.ExtensionsV1beta1().SandboxTemplates(b.o.namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		return err
	}
	pool := &extv1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: poolName, Namespace: b.o.namespace},
		Spec: extv1beta1.SandboxWarmPoolSpec{
			Replicas:    new(int32(0)),
			TemplateRef: extv1beta1.SandboxTemplateRef{Name: poolName},
		},
	}
	_, err := b.ext.ExtensionsV1beta1().SandboxWarmPools(b.o.namespace).Create(ctx, pool, metav1.CreateOptions{})
	return err
}

// podSpec is the production pod shape (deploy/chart) placed on the kwok nodes only.
func podSpec() corev1.PodSpec {
	return corev1.PodSpec{
		RuntimeClassName:              new("gvisor"),
		AutomountServiceAccountToken:  new(false),
		EnableServiceLinks:            new(false),
		TerminationGracePeriodSeconds: new(int64(2)),
		NodeSelector:                  map[string]string{kwokNodeLabel: "true"},
		Tolerations:                   []corev1.Toleration{{Key: kwokTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Containers: []corev1.Container{{
			Name:            "job",
			Image:           "sandbox-executor.local/ci:bookworm",
			ImagePullPolicy: corev1.PullNever,
			Command:         []string{"sleep", "infinity"},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("250m"),
				corev1.ResourceMemory: resource.MustParse("256Mi"),
			}},
		}},
	}
}

func (b *bench) teardown(ctx context.Context) error {
	logf("deleting namespace %s", b.o.namespace)
	return b.deleteNamespace(ctx)
}

func (b *bench) deleteNamespace(ctx context.Context) error {
	// Stop the refill first: a pool deleted with the namespace could otherwise still add pods.
	_ = b.setPool(ctx, 0)
	if err := b.kube.CoreV1().Namespaces().Delete(ctx, b.o.namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return waitFor(ctx, b.o.roundTimeout, "namespace "+b.o.namespace+" deleted", func() (bool, string, error) {
		_, err := b.kube.CoreV1().Namespaces().Get(ctx, b.o.namespace, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, "still terminating", err
	})
}

func (b *bench) setPool(ctx context.Context, replicas int) error {
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	_, err := b.ext.ExtensionsV1beta1().SandboxWarmPools(b.o.namespace).Patch(ctx, poolName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// result is one round.
type result struct {
	// setting indexes the controller setting the round ran with.
	setting            int
	warm               bool
	n, ok, warmHits    int
	errs               []string
	poolFill, wall     time.Duration
	cleanup            time.Duration
	ready, claim       []time.Duration
	cpu                map[string]float64
	apfWait, apfReject float64
	apfDispatched      float64
	queueWait, work    map[string]float64
	// writes counts the API server's mutating requests during the burst, by resource.
	writes map[string]float64
	// serverMean is the API server's own mean time for a non-watch request on agent-sandbox
	// resources (nearly all of them the controller's): what its reconciles wait for, server side.
	serverMean float64
	load       string
	// workers is what the controller said its workers were, after the burst.
	workers string
	// controllerRestarted: the controller's container was not the same after the burst.
	controllerRestarted bool
}

func (b *bench) round(ctx context.Context, idx, n int, warm bool) (*result, error) {
	r := &result{warm: warm, n: n}
	kind := kindName(warm)
	logf("round %d: %s, %d claims", idx, kind, n)
	// Fill (or empty) the pool first, and wait until it is Ready.
	size := 0
	if warm {
		size = n
	}
	fillStart := time.Now()
	if err := b.setPool(ctx, size); err != nil {
		return nil, err
	}
	if err := b.waitPool(ctx, size); err != nil {
		return nil, err
	}
	r.poolFill = time.Since(fillStart)
	logf("pool at %d Ready after %s", size, r.poolFill.Round(time.Millisecond))

	claimers, err := b.claimers(ctx, n)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range claimers {
			c.close()
		}
	}()

	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	jobID := func(i int) int64 { return int64(idx*100000 + i) }
	names := map[string]bool{}
	for i := range n {
		names[kube.ClaimName(runnerName, jobID(i))] = true
	}
	readyAt, allReady, err := b.watchReady(watchCtx, names)
	if err != nil {
		return nil, err
	}

	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		r.load = strings.Join(strings.Fields(string(raw))[:3], " ")
	}
	before := b.snapshot(ctx)
	starts := make([]time.Time, n)
	ends := make([]time.Time, n)
	results := make([]*kube.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			starts[i] = time.Now()
			results[i], errs[i] = claimers[i].claimer.Claim(ctx, kube.ClaimRequest{
				Namespace:      b.o.namespace,
				Pool:           poolName,
				Runner:         runnerName,
				Job:            kube.Job{ID: jobID(i), Timeout: time.Hour},
				Grace:          5 * time.Minute,
				ReadyTimeout:   b.o.roundTimeout,
				RuntimeClasses: []string{"gvisor"},
			})
			ends[i] = time.Now()
		})
	}
	begin := time.Now()
	close(gate)
	wg.Wait()
	last := slices.MaxFunc(ends, time.Time.Compare)
	r.wall = last.Sub(begin)
	// The shared watch may trail the per-claim ones by a moment.
	select {
	case <-allReady:
	case <-time.After(30 * time.Second):
	}
	stopWatch()
	after := b.snapshot(ctx)
	r.diff(before, after, b.priorityLevel)
	if r.controllerRestarted {
		b.ctrl.logRestart(ctx)
	}

	seen, late := readyAt()
	if late > 0 {
		logf("round %d: %d claims were first seen Ready in a re-list (their Ready time is late)", idx, late)
	}
	for i := range n {
		if errs[i] != nil {
			r.errs = append(r.errs, errs[i].Error())
			continue
		}
		r.ok++
		// A hit is a pool sandbox, Ready or still booting when adopted, as agent-sandbox's
		// launch-type label counted before prepare told the two apart.
		if results[i].Launch != kube.LaunchCold {
			r.warmHits++
		}
		r.claim = append(r.claim, ends[i].Sub(starts[i]))
		if t, ok := seen[results[i].Claim]; ok {
			r.ready = append(r.ready, t.Sub(starts[i]))
		}
	}
	slices.Sort(r.ready)
	slices.Sort(r.claim)
	logf("round %d: %d/%d Ready in %s, %d errors", idx, r.ok, n, r.wall.Round(time.Millisecond), len(r.errs))

	cleanStart := time.Now()
	err = b.cleanRound(ctx, claimers, names)
	r.cleanup = time.Since(cleanStart)
	logf("round %d: cleanup took %s", idx, r.cleanup.Round(time.Millisecond))
	return r, err
}

// waitPool waits until the pool's status and its sandboxes agree it holds size Ready sandboxes.
func (b *bench) waitPool(ctx context.Context, size int) error {
	pools := b.ext.ExtensionsV1beta1().SandboxWarmPools(b.o.namespace)
	return waitFor(ctx, b.o.roundTimeout, fmt.Sprintf("pool %s at %d Ready", poolName, size), func() (bool, string, error) {
		p, err := pools.Get(ctx, poolName, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		sbxs, err := b.sbx.AgentsV1beta1().Sandboxes(b.o.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		state := fmt.Sprintf("status %d/%d Ready, %d sandboxes", p.Status.ReadyReplicas, size, len(sbxs.Items))
		return int(p.Status.ReadyReplicas) == size && len(sbxs.Items) == size, state, nil
	})
}

// cleanRound empties the pool and releases every claim at once, each through its own claimer as
// N jobs' cleanup would (the sandboxes and pods are garbage-collected with the claims), then waits
// until the namespace holds no claim, sandbox or pod.
func (b *bench) cleanRound(ctx context.Context, claimers []claimer, names map[string]bool) error {
	if err := b.setPool(ctx, 0); err != nil {
		return err
	}
	errs := make([]error, len(claimers))
	var wg sync.WaitGroup
	i := 0
	for name := range names {
		c, slot := claimers[i], &errs[i]
		wg.Go(func() { *slot = c.claimer.Release(ctx, b.o.namespace, name, kube.AnyJob, kube.Outcome{}) })
		i++
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return waitFor(ctx, b.o.roundTimeout, "round cleanup", func() (bool, string, error) {
		claims, err := b.ext.ExtensionsV1beta1().SandboxClaims(b.o.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		sbxs, err := b.sbx.AgentsV1beta1().Sandboxes(b.o.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		pods, err := b.kube.CoreV1().Pods(b.o.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		left := len(claims.Items) + len(sbxs.Items) + len(pods.Items)
		return left == 0, fmt.Sprintf("%d claims, %d sandboxes, %d pods left", len(claims.Items), len(sbxs.Items), len(pods.Items)), nil
	})
}

// waitFor checks cond once a second. Only setup and cleanup wait this way; measured latencies
// come from watches.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	state := ""
	for {
		done, s, err := cond()
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if done {
			return nil
		}
		state = s
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return fmt.Errorf("%s: interrupted (%s)", what, state)
			}
			return fmt.Errorf("%s: not done after %s (%s)", what, timeout, state)
		case <-time.After(time.Second):
		}
	}
}

// claimer is one simulated `prepare` process: its own connection, its own clients.
type claimer struct {
	claimer *kube.Claimer
	close   func()
}

// claimers builds n claimers, each on its own TCP+TLS connection (a custom Dial keeps client-go
// from sharing one cached transport), and opens each connection with the pool check prepare
// makes before claiming.
func (b *bench) claimers(ctx context.Context, n int) ([]claimer, error) {
	out := make([]claimer, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			cfg := rest.CopyConfig(b.cfg)
			cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
			httpClient, err := rest.HTTPClientFor(cfg)
			if err != nil {
				errs[i] = err
				return
			}
			clients := &kube.Clients{}
			if clients.Kube, err = kubernetes.NewForConfigAndClient(cfg, httpClient); err == nil {
				if clients.Sandboxes, err = sandboxclient.NewForConfigAndClient(cfg, httpClient); err == nil {
					clients.Extensions, err = extclient.NewForConfigAndClient(cfg, httpClient)
				}
			}
			if err != nil {
				errs[i] = err
				return
			}
			c := kube.NewClaimer(clients, clock.RealClock{})
			if _, err := c.CheckPool(ctx, b.o.namespace, poolName); err != nil {
				errs[i] = err
				return
			}
			out[i] = claimer{claimer: c, close: httpClient.CloseIdleConnections}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range out {
			if c.close != nil {
				c.close()
			}
		}
		return nil, fmt.Errorf("connecting %d claimers: %w", n, err)
	}
	return out, nil
}

// watchReady watches the claims of the namespace and records when each of the named ones first
// turned Ready with a sandbox (claims of an earlier round may still be there, being deleted).
// allReady closes once all have. A watch the API server ends is resumed from
// the last resource version seen; only if that is too old does it re-list, and claims first seen
// Ready in a re-list are stamped late (counted in relisted).
func (b *bench) watchReady(ctx context.Context, names map[string]bool) (readyAt func() (map[string]time.Time, int), allReady <-chan struct{}, err error) {
	claims := b.ext.ExtensionsV1beta1().SandboxClaims(b.o.namespace)
	var mu sync.Mutex
	seen := map[string]time.Time{}
	relisted := 0
	done := make(chan struct{})
	record := func(c *extv1beta1.SandboxClaim, now time.Time, fromList bool) {
		cond := meta.FindStatusCondition(c.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady))
		if !names[c.Name] || cond == nil || cond.Status != metav1.ConditionTrue || c.Status.SandboxStatus.Name == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if _, dup := seen[c.Name]; dup {
			return
		}
		seen[c.Name] = now
		if fromList {
			relisted++
		}
		if len(seen) == len(names) {
			close(done)
		}
	}
	relist := func() (string, error) {
		list, err := claims.List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		now := time.Now()
		for i := range list.Items {
			record(&list.Items[i], now, true)
		}
		return list.ResourceVersion, nil
	}
	rv, err := relist()
	if err != nil {
		return nil, nil, err
	}
	go func() {
		for ctx.Err() == nil {
			w, err := claims.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				now := time.Now()
				if ev.Type == watch.Error {
					if ctx.Err() == nil {
						logf("claims watch: %v; re-listing", apierrors.FromObject(ev.Object))
						if fresh, err := relist(); err == nil {
							rv = fresh
						}
					}
					break
				}
				c, ok := ev.Object.(*extv1beta1.SandboxClaim)
				if !ok {
					continue
				}
				rv = c.ResourceVersion
				if ev.Type != watch.Deleted && ev.Type != watch.Bookmark {
					record(c, now, false)
				}
			}
			w.Stop()
		}
	}()
	return func() (map[string]time.Time, int) {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen), relisted
	}, done, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s scale: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
