// Package doctor implements the doctor command: it checks a cluster before sandbox-executor uses
// it, with the executor's own credentials, and prints one line per check:
//
//	ok|warn|FAIL  <check>: <detail>[; fix: <what to do>]
//
// A FAIL means jobs will fail; a warn means they run but less safely or more slowly than they
// should. doctor fails (exit 1) when any check FAILs, and exits 2, as every verb does, when the
// API server cannot be reached: nothing else was checked then.
package doctor

import (
	"context"
	"fmt"
	"net/http"

	"github.com/urfave/cli/v2"
	corev1 "k8s.io/api/core/v1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Status is a check's outcome.
type Status string

const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "FAIL"
)

// Result is one check's line.
type Result struct {
	Status Status
	Check  string
	Detail string
	Fix    string
}

func (r Result) String() string {
	s := fmt.Sprintf("%-4s  %s: %s", r.Status, r.Check, r.Detail)
	if r.Fix != "" {
		s += "; fix: " + r.Fix
	}
	return s
}

// Command is the doctor verb and its flags.
func Command(setup stages.Setup) *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check the cluster before use: CRDs, RBAC, RuntimeClasses, pools, their templates and NetworkPolicies, what their pods' netfence found of runsc, the cold-start admission policy, egress proxies (exit 1 on any FAIL; 2, as every verb, when the API server cannot be reached)",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "kubelet", Usage: "also read every node's kubelet podPidsLimit (needs cluster-admin credentials)"},
		},
		Action: setup(func(c *cli.Context, env *stages.Env) error {
			return Run(c.Context, env, Options{Kubelet: c.Bool("kubelet")})
		}),
	}
}

// Options select optional checks.
type Options struct {
	// Kubelet reads every node's kubelet configuration (podPidsLimit). It needs list nodes and
	// get nodes/proxy, which the executor is never granted: run it with cluster-admin credentials.
	Kubelet bool
}

// Checker runs the checks against one cluster.
type Checker struct {
	Config  *config.Config
	Clients *kube.Clients
	Options Options
	// KubeletConfigz returns a node's /configz through the API server's node proxy; tests
	// replace it.
	KubeletConfigz func(ctx context.Context, node string) ([]byte, error)

	// HTTP reaches the egress proxies' admin ports; tests replace it.
	HTTP *http.Client
	// Version is this build, which the stage server should run too.
	Version string

	// tolerations of the job pods (templates and RuntimeClasses seen so far): the kubelet check
	// skips nodes whose taints keep job pods off.
	tolerations []corev1.Toleration
	// templates found by the pool checks, for the NetworkPolicy check.
	templates []*extv1beta1.SandboxTemplate
	// pools found by the pool checks, for the netfence check.
	pools []*extv1beta1.SandboxWarmPool
}

// Run prints every check's line and fails when any check FAILs.
func Run(ctx context.Context, env *stages.Env, opts Options) error {
	clients, err := env.Clients()
	if err != nil {
		fmt.Fprintln(env.Stdout, Result{Fail, "kubernetes client", err.Error(), "set kubeconfig/context in " + env.Config.Path() + ", or run in the cluster with a ServiceAccount token"})
		return err
	}
	failed := 0
	results := (&Checker{Config: env.Config, Clients: clients, Options: opts, Version: env.Version}).Run(ctx)
	for _, r := range results {
		fmt.Fprintln(env.Stdout, r)
		if r.Status == Fail {
			failed++
		}
	}
	if api := results[0]; api.Status == Fail {
		// An API server that does not answer is a system failure, the same exit code as in gc or
		// a stage: nothing about the cluster was checked.
		return failure.SystemError(nil, "doctor: %s: %s", api.Check, api.Detail)
	}
	if failed > 0 {
		return failure.PermanentError(nil, "doctor: %d of %d checks failed", failed, len(results))
	}
	return nil
}

// Run runs the checks in order. Nothing else is worth asking an API server that does not answer.
func (c *Checker) Run(ctx context.Context) []Result {
	c.tolerations, c.templates, c.pools = nil, nil, nil
	api := c.checkAPI()
	if api.Status == Fail {
		return []Result{api}
	}
	out := []Result{api}
	out = append(out, c.checkCRDs()...)
	out = append(out, c.checkRBAC(ctx)...)
	out = append(out, c.checkRuntimeClasses(ctx)...)
	out = append(out, c.checkPools(ctx)...)
	out = append(out, c.checkNetworkPolicies(ctx)...)
	out = append(out, c.checkNetfence(ctx)...)
	if c.Config.UnknownImage == config.UnknownImageCold {
		out = append(out, c.checkColdStartPolicy(ctx))
	}
	out = append(out, c.checkEgressProxies(ctx)...)
	if c.Options.Kubelet {
		out = append(out, c.checkKubelets(ctx)...)
	}
	if c.Config.StageServer != "" {
		out = append(out, c.checkStageServer(ctx))
	}
	return out
}

func oneLine(err error) string { return failure.OneLine(err.Error()) }
