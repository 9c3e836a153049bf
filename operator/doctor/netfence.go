package doctor

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/netfence"
	"github.com/sandbox-executor/sandbox-executor/failure"
)

// The netstack fence's runtime. doctor cannot ask runsc its version: a RuntimeClass names only a
// handler, the nodes report containerd's version, and the executor may exec only into job pods,
// whose job container holds none of the capabilities the probes need. The netfence init
// container of each pod proves the runtime itself before it writes the fence (netfence.ProveRuntime)
// and fails the pod in one line naming the runsc release it needs; doctor reads that outcome from
// each pool's pods.

// checkNetfence reports, for each pool whose template has a netfence init container, what that
// container said in the pool's pods.
func (c *Checker) checkNetfence(ctx context.Context) []Result {
	var out []Result
	for _, pool := range c.pools {
		i := slices.IndexFunc(c.templates, func(t *extv1beta1.SandboxTemplate) bool { return t.Name == pool.Spec.TemplateRef.Name })
		if i < 0 {
			continue
		}
		container := netfenceContainer(c.templates[i].Spec.PodTemplate.Spec)
		if container == "" {
			continue
		}
		out = append(out, c.checkPoolNetfence(ctx, pool, container))
	}
	return out
}

func (c *Checker) checkPoolNetfence(ctx context.Context, pool *extv1beta1.SandboxWarmPool, container string) Result {
	check := "netfence pool " + pool.Name
	needs := "the netfence init container needs runsc " + netfence.MinRunsc + " or later"
	if pool.Status.Selector == "" {
		return Result{Warn, check, needs + "; cannot find the pool's pods: the SandboxWarmPool has no status.selector", "check that the agent-sandbox controller runs"}
	}
	pods, err := c.Clients.Pods(ctx, pool.Namespace, pool.Status.Selector)
	switch {
	case apierrors.IsForbidden(err):
		return Result{Warn, check, needs + "; cannot verify what it found: this identity may not list pods in namespace " + pool.Namespace, "bind the executor's identity to the chart's Role ...-doctor (helm upgrade)"}
	case err != nil:
		return Result{Fail, check, oneLine(err), "check the API server"}
	}
	var proven int
	var failed []string
	for _, pod := range pods {
		i := slices.IndexFunc(pod.Status.InitContainerStatuses, func(s corev1.ContainerStatus) bool { return s.Name == container })
		if i < 0 {
			continue
		}
		s := pod.Status.InitContainerStatuses[i]
		switch ended := s.State.Terminated; {
		case ended != nil && ended.ExitCode == 0:
			proven++
		case ended != nil:
			failed = append(failed, pod.Name+": "+netfenceFailure(ended))
		case s.LastTerminationState.Terminated != nil && s.LastTerminationState.Terminated.ExitCode != 0:
			// Restarting after a failure (CrashLoopBackOff).
			failed = append(failed, pod.Name+": "+netfenceFailure(s.LastTerminationState.Terminated))
		}
	}
	switch {
	case len(failed) > 0:
		return Result{Fail, check, fmt.Sprintf("the netfence init container failed in %d of %d pods, so they never start; %s", len(failed), len(pods), failed[0]),
			fmt.Sprintf("if it names runsc, upgrade runsc on the nodes of the pool's RuntimeClass to %s or later (docs/install.md#versions); otherwise kubectl -n %s logs %s -c %s; or set the template's netstackFence: false to rely on NetworkPolicy alone",
				netfence.MinRunsc, pool.Namespace, strings.SplitN(failed[0], ":", 2)[0], container)}
	case proven == 0:
		return Result{Warn, check, fmt.Sprintf("%s; none of the pool's %d pods has run it yet", needs, len(pods)), "run doctor again once the pool has pods"}
	}
	return Result{OK, check, fmt.Sprintf("in %d of %d pods the netfence init container proved the runtime keeps jobs from rewriting the netstack fence (runsc %s or later) and wrote it", proven, len(pods), netfence.MinRunsc), ""}
}

// netfenceFailure is what a failed netfence container said: its termination message (the
// chart's container falls back to its log, the verb's one line), else its exit.
func netfenceFailure(ended *corev1.ContainerStateTerminated) string {
	if msg := failure.OneLine(strings.TrimSpace(ended.Message)); msg != "" {
		return msg
	}
	return fmt.Sprintf("%s (exit %d)", ended.Reason, ended.ExitCode)
}

// netfenceContainer is the name of the init container that runs the agent's netfence verb, or "".
func netfenceContainer(spec corev1.PodSpec) string {
	for _, c := range spec.InitContainers {
		if argv := slices.Concat(c.Command, c.Args); len(argv) >= 2 && argv[1] == "netfence" {
			return c.Name
		}
	}
	return ""
}
