package gitlab

import (
	"fmt"
	"strings"
)

// GitLab's default images for Duo Agent Platform flows, under any registry (an instance may
// mirror them: the duo_workflows_default_image_registry setting), at any tag.
const (
	flowImagePath         = "/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image"
	flowImageHardenedPath = flowImagePath + "-hardened"
)

// flowImageSRT says what SRT does in one of GitLab's default flow images, and "" for any other
// image.
func flowImageSRT(image string) string {
	repo, _, _ := strings.Cut(image, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	switch {
	case strings.HasSuffix(repo, flowImageHardenedPath):
		return "this image has no SRT"
	case strings.HasSuffix(repo, flowImagePath):
		return "SRT in this image cannot build its own sandbox without privileges and will say it runs the flow directly: expected here, this pod is the sandbox"
	}
	return ""
}

// IsFlowImage tells whether image is one of GitLab's default flow images (any registry, any tag).
func IsFlowImage(image string) bool { return flowImageSRT(image) != "" }

// FlowImageIsolation is the job-log line that says where a flow's isolation comes from when
// its pod runs one of GitLab's default flow images, and "" for any other image. The default
// image wraps the flow in SRT, whose sandbox needs privileges that a gVisor pod does not give
// (its probe fails and the flow's script prints that it runs the command directly): the line
// says so before the user meets that warning. The hardened image has no SRT.
func FlowImageIsolation(image, runtimeClass, pool, fence string) string {
	srt := flowImageSRT(image)
	if srt == "" {
		return ""
	}
	return fmt.Sprintf("Isolation: this flow runs under gVisor (RuntimeClass %s), not SRT, fenced by %s of pool %s; %s", runtimeClass, fence, pool, srt)
}

// FlowNetworkPolicy is the job-log line that tells a flow's user what became of
// agent-config.yml's network_policy, for GitLab's default flow images ("" for any other image).
// GitLab writes it into SRT's settings inside the job script, which SRT cannot enforce here and
// the runner never parses: the pool's egress is the job's, whatever the project allowed or
// denied. Saying so before the flow runs keeps a denied domain the pool grants from surprising
// anyone (docs/agent-config.md).
func FlowNetworkPolicy(image, pool string, proxied bool) string {
	if flowImageSRT(image) == "" {
		return ""
	}
	fence, refused := "NetworkPolicy", "anything else is dropped"
	if proxied {
		fence, refused = "egress proxy", "anything else is refused and named in this log"
	}
	return fmt.Sprintf("Network policy: agent-config.yml's network_policy configures SRT and is not applied here: "+
		"this job reaches only what the %s of pool %s allows, which allowed_domains and include_recommended_allowed do not widen "+
		"and denied_domains does not narrow; %s", fence, pool, refused)
}
