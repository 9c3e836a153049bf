package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxclient "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned"
	extclient "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/kube"
)

// The bench's set-up and tear-down: its namespace, pool and template, the kwok nodes, the
// controller's settings, and the claimers, each on its own connection.

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
		if b.priorityLevel, err = priorityLevel(ctx, cfg, b.kube, namespace, b.ctrl.ServiceAccount, o.namespace); err != nil {
			logf("cannot tell the controller's API priority level: %v", err)
		}
		runErr = b.settings(ctx)
	}
	// Always leave the controller as found and nothing behind, even after a failed or
	// interrupted round; never touch a namespace that is not ours.
	if err := b.ctrl.Restore(ctx); err != nil {
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
