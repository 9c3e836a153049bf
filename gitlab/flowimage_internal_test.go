package gitlab

import (
	"strings"
	"testing"
)

func TestFlowImageIsolation(t *testing.T) {
	const repo = "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/"
	for _, c := range []struct{ image, want string }{
		{repo + "workflow-generic-image:v0.0.21", "SRT in this image cannot build its own sandbox"},
		{repo + "workflow-generic-image:v0.0.15@sha256:0123", "SRT in this image cannot build its own sandbox"},
		{"registry.internal.example:5000/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image", "SRT in this image"},
		{repo + "workflow-generic-image-hardened:v0.0.21", "this image has no SRT"},
		{repo + "workflow-generic-image-other:v1", ""},
		{"registry.example.com/duo/ci:bookworm", ""},
		{"", ""},
	} {
		got := FlowImageIsolation(c.image, "gvisor", "duo-stock", "NetworkPolicy and the egress proxy")
		if c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("FlowImageIsolation(%q) = %q, want one containing %q", c.image, got, c.want)
		}
		if c.want != "" && !strings.HasPrefix(got, "Isolation: this flow runs under gVisor (RuntimeClass gvisor), not SRT, fenced by NetworkPolicy and the egress proxy of pool duo-stock; ") {
			t.Errorf("FlowImageIsolation(%q) = %q", c.image, got)
		}
	}
}

func TestFlowNetworkPolicy(t *testing.T) {
	const image = "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image"
	proxied := FlowNetworkPolicy(image+":v0.0.15", "duo-flow", true)
	for _, want := range []string{
		"Network policy: agent-config.yml's network_policy configures SRT and is not applied here",
		"only what the egress proxy of pool duo-flow allows",
		"denied_domains does not narrow",
		"refused and named in this log",
	} {
		if !strings.Contains(proxied, want) {
			t.Errorf("proxied pool: %q lacks %q", proxied, want)
		}
	}
	if fenced := FlowNetworkPolicy(image+"-hardened:v0.0.21", "duo-flow-hardened", false); !strings.Contains(fenced, "only what the NetworkPolicy of pool duo-flow-hardened allows") ||
		!strings.HasSuffix(fenced, "anything else is dropped") {
		t.Errorf("NetworkPolicy-only pool: %q", fenced)
	}
	if got := FlowNetworkPolicy("registry.example.com/duo/ci:bookworm", "duo-default", true); got != "" {
		t.Errorf("an image of no flow: %q, want none", got)
	}
}
