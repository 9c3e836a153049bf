package doctor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

// What jobs reach over the network: the templates' NetworkPolicies, the egress proxies and the
// stage server.

// stageServerTimeout bounds the stage server's answer to a ping: it answers at once.
const stageServerTimeout = 5 * time.Second

// checkStageServer asks the stage server that stage_server names whether it serves, and which
// build it runs: one started before an upgrade still runs the old one.
func (c *Checker) checkStageServer(ctx context.Context) Result {
	const check = "stage server"
	socket := c.Config.StageServer
	ctx, cancel := context.WithTimeout(ctx, stageServerTimeout)
	defer cancel()
	version, err := stageserver.Ping(ctx, socket)
	switch {
	case errors.Is(err, stageserver.ErrUnavailable):
		return Result{Warn, check, "nobody listens on " + socket + ": prepare and cleanup run in their own processes (slower)",
			"start sandbox-executor serve as the runner's user (docs/install.md#the-stage-server), or unset stage_server in " + c.Config.Path()}
	case err != nil:
		return Result{Fail, check, oneLine(err), "run sandbox-executor serve as the user gitlab-runner runs stages as, with stage_server in " + c.Config.Path() + " naming its socket"}
	case c.Version != "" && version != c.Version:
		return Result{Warn, check, fmt.Sprintf("%s runs version %s, this binary is %s: it refuses this build's stages, which run in their own processes (slower)", socket, version, c.Version), "restart sandbox-executor serve after an upgrade"}
	}
	return Result{OK, check, "listening on " + socket + " (version " + version + ")", ""}
}

// checkNetworkPolicies finds each checked template's NetworkPolicy: with networkPolicyManagement
// Managed, agent-sandbox makes one per template (owned by it); a template without one leaves its
// pods' egress open.
func (c *Checker) checkNetworkPolicies(ctx context.Context) []Result {
	if len(c.templates) == 0 {
		return nil
	}
	ns := c.Config.Namespace
	policies, err := c.Clients.NetworkPolicies(ctx, ns)
	switch {
	case apierrors.IsForbidden(err):
		return []Result{{Warn, "networkpolicies", "cannot verify: this identity may not list networkpolicies in namespace " + ns, "bind the executor's identity to the chart's Role ...-doctor (helm upgrade)"}}
	case err != nil:
		return []Result{{Fail, "networkpolicies", oneLine(err), "check the API server"}}
	}
	var out []Result
	for _, t := range c.templates {
		check := "networkpolicy " + t.Name
		if t.Spec.NetworkPolicyManagement == extv1beta1.NetworkPolicyManagementUnmanaged {
			out = append(out, Result{Warn, check, "networkPolicyManagement Unmanaged: not checked", "set networkPolicyManagement Managed with a networkPolicy (the chart's templates do)"})
			continue
		}
		policy := templatePolicy(policies, t.Name)
		switch {
		case policy == nil:
			out = append(out, Result{Fail, check, "agent-sandbox has made no NetworkPolicy for template " + t.Name + ": its pods' egress is open",
				"check that the agent-sandbox controller runs (its logs) and that the cluster's network plugin enforces NetworkPolicy"})
		case !slices.Contains(policy.Spec.PolicyTypes, networkingv1.PolicyTypeEgress):
			out = append(out, Result{Fail, check, "NetworkPolicy " + policy.Name + " does not restrict egress", "give the template a networkPolicy with egress rules (the chart's templates have them)"})
		default:
			out = append(out, Result{OK, check, "NetworkPolicy " + policy.Name + " restricts ingress and egress", ""})
		}
	}
	return out
}

func templatePolicy(policies []networkingv1.NetworkPolicy, template string) *networkingv1.NetworkPolicy {
	for i := range policies {
		if owner := metav1.GetControllerOf(&policies[i]); owner != nil && owner.Kind == "SandboxTemplate" && owner.Name == template {
			return &policies[i]
		}
	}
	return nil
}

// checkEgressProxies asks each configured egress proxy's admin port for /healthz, as the run
// stage will ask it for blocked attempts: directly, and over https with the certificate
// verified against egress_admin_ca_file, as the stages do.
func (c *Checker) checkEgressProxies(ctx context.Context) []Result {
	var out []Result
	client := c.HTTP
	if client == nil {
		ca, err := c.Config.EgressAdminCA()
		if err != nil {
			return []Result{{Fail, "egress proxies", oneLine(err), "fix egress_admin_ca_file in " + c.Config.Path()}}
		}
		client = adminclient.HTTPClient(ca)
		client.Timeout = 5 * time.Second
	}
	for _, p := range c.Config.Pools {
		if p.EgressProxy == "" {
			continue
		}
		check := "egress proxy " + p.Name
		url := strings.TrimSuffix(p.EgressProxy, "/") + "/healthz"
		const fix = "check the egress proxy's Deployment and Service (the chart's egressProxy.enabled), and that its NetworkPolicy admits this runner (label app.kubernetes.io/name=sandbox-executor-runner)"
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			out = append(out, Result{Fail, check, oneLine(err), "fix egress_proxy in " + c.Config.Path()})
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			out = append(out, Result{Fail, check, "admin port unreachable: " + oneLine(err), fix})
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			out = append(out, Result{Fail, check, url + " answered " + resp.Status, fix})
			continue
		}
		out = append(out, Result{OK, check, url + " answers", ""})
	}
	return out
}
