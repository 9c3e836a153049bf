package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// stateFile is where prepare leaves the claimed sandbox for the stages after it: the runner's
// per-job TMPDIR, which it removes when the job ends.
const stateFile = "sandbox-executor-state.json"

// SaveSandbox records the claimed sandbox for later stages.
func SaveSandbox(tmpDir string, sbx *Sandbox) error {
	if tmpDir == "" {
		return nil // older runners: later stages resolve the claim again
	}
	data, err := json.Marshal(sbx)
	if err != nil {
		return err
	}
	tmp := filepath.Join(tmpDir, stateFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return SystemError(err, "saving job state")
	}
	return os.Rename(tmp, filepath.Join(tmpDir, stateFile))
}

// SavedSandbox is the sandbox prepare saved for the job named claimName, or nil if there is none
// (no TMPDIR, prepare did not get that far, another job's state).
func SavedSandbox(tmpDir, claimName string) (*Sandbox, error) {
	if tmpDir == "" {
		return nil, nil
	}
	data, err := os.ReadFile(filepath.Join(tmpDir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, SystemError(err, "reading job state")
	}
	var sbx Sandbox
	if json.Unmarshal(data, &sbx) != nil || sbx.Pod == "" || sbx.JobObject() != claimName {
		return nil, nil
	}
	return &sbx, nil
}

// Origin says where the job's sandbox came from, for the job log ("pool duo-default (warm
// start)"), and how the job got it ("claimed", or "created" for a cold start of its own).
func (s *Sandbox) Origin() (origin, acquired string) {
	if s.ColdTemplate != "" {
		return fmt.Sprintf("template %s (cold start: no warm pool serves the image)", s.ColdTemplate), "created"
	}
	launch := "cold"
	if s.Warm {
		launch = "warm"
	}
	return fmt.Sprintf("pool %s (%s start)", s.Pool, launch), "claimed"
}

// JobObject names what the job owns: its claim, or its cold-started Sandbox (named like the
// claim would be).
func (s *Sandbox) JobObject() string {
	if s.ColdTemplate != "" {
		return s.SandboxName
	}
	return s.Claim
}

// LoadSandbox finds the job's sandbox: from prepare's state file when there is one, else by
// resolving the job's deterministic claim name again, or the cold-started Sandbox of that name.
func (c *Claimer) LoadSandbox(ctx context.Context, tmpDir, namespace, claimName string, runtimeClasses []string) (*Sandbox, error) {
	if saved, err := SavedSandbox(tmpDir, claimName); saved != nil || err != nil {
		return saved, err
	}
	claim, err := c.Clients.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).Get(ctx, claimName, metav1.GetOptions{})
	if isObjectNotFound(err) {
		if cold, err := c.findColdStart(ctx, namespace, claimName, runtimeClasses); cold != nil || err != nil {
			return cold, err
		}
		return nil, SystemError(nil, "SandboxClaim (or cold-started Sandbox) %s/%s is gone: the job's sandbox was released or expired", namespace, claimName)
	}
	if err != nil {
		return nil, explainAPIError(err, apiCall{"get", resourceClaims, namespace, claimName})
	}
	if ok, why := claimReady(claim); !ok {
		return nil, SystemError(nil, "SandboxClaim %s/%s is not Ready: %s", namespace, claimName, why)
	}
	return c.Resolve(ctx, claim, runtimeClasses)
}

// ForgetSandbox removes the state file after cleanup.
func ForgetSandbox(tmpDir string) {
	if tmpDir != "" {
		_ = os.Remove(filepath.Join(tmpDir, stateFile))
	}
}
