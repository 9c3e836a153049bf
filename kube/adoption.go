package kube

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	watchtools "k8s.io/client-go/tools/watch"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// watchAdoption watches for the claim's sandbox as agent-sandbox hands it over. The claim
// controller adopts a pool sandbox with one patch that makes the claim its controller and labels
// it with the claim's UID (completeAdoption in v0.5.6); the claim's own Ready condition follows in
// a later status write, about 15 ms later on the local cluster. A sandbox that the claim controls
// and that is Ready is everything the claim's Ready would report, so prepare can go on from it at
// once. Best effort: the channel yields the sandbox, or nil when the watch ends first (ctx
// cancelled, an API error, a claim without a UID), and then the claim's Ready decides.
func (c *Claimer) watchAdoption(ctx context.Context, claim *extv1beta1.SandboxClaim) <-chan *sandboxv1beta1.Sandbox {
	out := make(chan *sandboxv1beta1.Sandbox, 1)
	if claim.UID == "" {
		out <- nil
		return out
	}
	if lines := c.clients.AgentLines; lines != nil {
		// In the stage server: its watch of the namespace's Sandboxes runs already, so the
		// adoption is seen as soon as it is made, with no watch to open after the create.
		if found, stop, ok := lines.adoption(claim); ok {
			go func() {
				defer stop()
				select {
				case sbx := <-found:
					out <- sbx
				case <-ctx.Done():
					out <- nil
				}
			}()
			return out
		}
	}
	go func() {
		var adopted *sandboxv1beta1.Sandbox
		defer func() { out <- adopted }()
		selector := labels.SelectorFromSet(labels.Set{extv1beta1.SandboxIDLabel: string(claim.UID)}).String()
		// No resourceVersion: the watch starts with the state at its start, so an adoption made
		// before it is one of its first events.
		w, err := c.clients.Sandboxes.AgentsV1beta1().Sandboxes(claim.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return
		}
		_, _ = watchtools.UntilWithoutRetry(ctx, w, func(ev watch.Event) (bool, error) {
			sbx, ok := ev.Object.(*sandboxv1beta1.Sandbox)
			if !ok || ev.Type == watch.Deleted || ev.Type == watch.Error {
				return false, nil
			}
			if adoptedAndReady(sbx, claim) {
				adopted = sbx
				return true, nil
			}
			return false, nil
		})
	}()
	return out
}

// adoptedAndReady: the claim controls sbx (as agent-sandbox records an adoption or a sandbox it
// created for the claim) and sbx is Ready and not on its way out.
func adoptedAndReady(sbx *sandboxv1beta1.Sandbox, claim *extv1beta1.SandboxClaim) bool {
	owner := metav1.GetControllerOf(sbx)
	if owner == nil || owner.UID != claim.UID || sbx.Labels[extv1beta1.SandboxIDLabel] != string(claim.UID) || sbx.DeletionTimestamp != nil {
		return false
	}
	ready, _, _ := readyState(sbx.Status.Conditions, nil)
	return ready
}

// awaitSandbox waits for the claim's sandbox and resolves it: from the adoption as soon as it is
// seen (watchAdoption), or from the claim once Ready, whichever comes first. A sandbox found by
// its adoption that does not resolve (its pod not read yet, or refused) is resolved again, and
// verified again, from the claim's Ready, which has the last word. It reports whether it went by
// the adoption.
func (c *Claimer) awaitSandbox(ctx context.Context, claim *extv1beta1.SandboxClaim, req ClaimRequest) (*Sandbox, bool, error) {
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	adoption := c.watchAdoption(watchCtx, claim)
	type claimReady struct {
		claim *extv1beta1.SandboxClaim
		err   error
	}
	ready := make(chan claimReady, 1)
	go func() {
		r, err := c.waitClaimReady(watchCtx, claim, req.ReadyTimeout)
		ready <- claimReady{r, err}
	}()
	var fromClaim claimReady
	select {
	case adopted := <-adoption:
		if adopted != nil {
			c.announce(req, adopted)
			sbx, err := c.resolveSandbox(ctx, claim, adopted.Name, adopted, req.RuntimeClasses, req.AgentLog)
			if err == nil {
				cancel()
				<-ready
				return sbx, true, nil
			}
		}
		fromClaim = <-ready
	case fromClaim = <-ready:
		cancel()
		<-adoption
	}
	if fromClaim.err != nil {
		return nil, false, fromClaim.err
	}
	sbx, err := c.resolve(ctx, fromClaim.claim, req.RuntimeClasses, req.AgentLog)
	return sbx, false, err
}

// announce tells req.Ahead the adopted sandbox's pod address and identity line, when the stage
// server has read them ahead.
func (c *Claimer) announce(req ClaimRequest, sbx *sandboxv1beta1.Sandbox) {
	if req.Ahead == nil || !req.AgentLog || c.clients.AgentLines == nil {
		return
	}
	if podIP, line, ok := c.clients.AgentLines.candidate(PodNameOf(sbx)); ok {
		req.Ahead(podIP, line)
	}
}
