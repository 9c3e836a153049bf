package kube

import "k8s.io/apimachinery/pkg/types"

// KeepForTest keeps line as read ahead from the pod of this name (its UID, container ID and
// address), as Run would.
func (a *AgentLines) KeepForTest(pod, podUID, containerID, podIP, line string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lines[pod] = agentLine{podUID: types.UID(podUID), containerID: containerID, podIP: podIP, line: line}
}

// WatchingForTest reports whether the watch of Sandboxes runs.
func (a *AgentLines) WatchingForTest() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.watching
}
