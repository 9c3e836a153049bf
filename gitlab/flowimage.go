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

// FlowImageIsolation is the job-log line that says where a flow's isolation comes from when
// its pod runs one of GitLab's default flow images, and "" for any other image. The default
// image wraps the flow in SRT, whose sandbox needs privileges that a gVisor pod does not give
// (its probe fails and the flow's script prints that it runs the command directly): the line
// says so before the user meets that warning. The hardened image has no SRT.
func FlowImageIsolation(image, runtimeClass, pool, fence string) string {
	repo, _, _ := strings.Cut(image, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	var srt string
	switch {
	case strings.HasSuffix(repo, flowImageHardenedPath):
		srt = "this image has no SRT"
	case strings.HasSuffix(repo, flowImagePath):
		srt = "SRT in this image cannot build its own sandbox without privileges and will say it runs the flow directly: expected here, this pod is the sandbox"
	default:
		return ""
	}
	return fmt.Sprintf("Isolation: this flow runs under gVisor (RuntimeClass %s), not SRT, fenced by %s of pool %s; %s", runtimeClass, fence, pool, srt)
}
