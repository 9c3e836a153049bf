package kube

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// AgentLines reads the first log line of every Ready sandbox's pod in a namespace ahead of time:
// the stage agent's identity line, whose key prepare pins (ClaimRequest.AgentLog). A
// long-running process (the stage server) keeps it, so that a prepare there takes the line of
// the pod it is handed from memory instead of reading the pod's log through the API server and
// the kubelet on the job's path. A line counts only for the container instance it was read
// from: Lookup matches the pod's UID and the job container's ID as prepare's own read of the pod
// shows them, and anything else (another pod of the name, a restarted container, a line not read
// yet) is a miss, which prepare reads itself as without it.
//
// It needs nothing the executor's Role does not grant: a watch of Sandboxes (without a list: a
// watch without a resourceVersion starts with the objects there), and get on pods and pods/log.
type AgentLines struct {
	clients   *Clients
	namespace string
	// reading bounds the reads at once: a watch starts with every sandbox of the namespace.
	reading chan struct{}
	mu      sync.Mutex
	lines   map[string]agentLine // by pod name
	// The adopted Sandboxes as the watch last showed them, by the claim UID they are labelled
	// with (while watching), and the claims waiting for their adoption (adoption): the watch runs
	// already, so a prepare in the stage server sees its adoption without opening a watch of its
	// own after its create.
	watching bool
	adopted  map[types.UID]*sandboxv1beta1.Sandbox
	waiting  map[*adoptionWait]struct{}
}

// adoptionWait is a claim waiting for the sandbox it adopts.
type adoptionWait struct {
	claim *extv1beta1.SandboxClaim
	found chan *sandboxv1beta1.Sandbox // buffered: one send
}

// agentLinesReads is how many pods' lines are read at once.
const agentLinesReads = 4

type agentLine struct {
	podUID      types.UID
	containerID string
	podIP       string
	line        string
}

// NewAgentLines keeps the lines of namespace's pods once Run runs.
func NewAgentLines(clients *Clients, namespace string) *AgentLines {
	return &AgentLines{clients: clients, namespace: namespace, reading: make(chan struct{}, agentLinesReads), lines: map[string]agentLine{},
		adopted: map[types.UID]*sandboxv1beta1.Sandbox{}, waiting: map[*adoptionWait]struct{}{}}
}

// agentLinesRewatch spaces the watches: the API server ends each after a few minutes, and an
// error (RBAC, the API server away) must not turn into a tight loop.
const agentLinesRewatch = time.Second

// Run watches the namespace's Sandboxes until ctx ends, reading the line of each Ready one's pod
// once and forgetting it when the Sandbox goes.
func (a *AgentLines) Run(ctx context.Context) {
	var reads sync.WaitGroup
	defer reads.Wait()
	wait.JitterUntilWithContext(ctx, func(ctx context.Context) { a.watchOnce(ctx, &reads) }, agentLinesRewatch, 0.5, true)
}

func (a *AgentLines) watchOnce(ctx context.Context, reads *sync.WaitGroup) {
	w, err := a.clients.Sandboxes.AgentsV1beta1().Sandboxes(a.namespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	defer w.Stop()
	// A new watch starts with the Sandboxes there now: what the last one saw may be stale.
	a.setWatching(true)
	defer a.setWatching(false)
	for {
		var ev watch.Event
		select {
		case <-ctx.Done():
			return
		case e, open := <-w.ResultChan():
			if !open {
				return
			}
			ev = e
		}
		sbx, ok := ev.Object.(*sandboxv1beta1.Sandbox)
		if !ok {
			continue
		}
		a.seen(ev.Type, sbx)
		pod := PodNameOf(sbx)
		if ev.Type == watch.Deleted || sbx.DeletionTimestamp != nil {
			a.forget(pod)
			continue
		}
		if ready, _, _ := readyState(sbx.Status.Conditions, nil); !ready || a.has(pod) {
			continue
		}
		select {
		case a.reading <- struct{}{}:
		case <-ctx.Done():
			return
		}
		reads.Add(1)
		go func() {
			defer func() { <-a.reading; reads.Done() }()
			a.read(ctx, pod)
		}()
	}
}

// read reads the pod's first log line, with the pod's UID and its job container's ID from a
// read of the pod before it: a container that restarts in between has another ID by the time a
// prepare reads the pod, so its new line is never taken for the old one's.
func (a *AgentLines) read(ctx context.Context, name string) {
	pod, err := a.clients.Kube.CoreV1().Pods(a.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil || pod.Status.Phase != corev1.PodRunning {
		return
	}
	id := containerID(pod)
	if id == "" {
		return
	}
	line, err := headLogLine(ctx, a.clients.Kube, a.namespace, name)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lines[name] = agentLine{podUID: pod.UID, containerID: id, podIP: pod.Status.PodIP, line: line}
}

// Lookup is the first log line of pod's job container if it was read from this very container
// (the pod's UID and the container's ID as pod shows them).
func (a *AgentLines) Lookup(pod *corev1.Pod) (string, bool) {
	id := containerID(pod)
	a.mu.Lock()
	defer a.mu.Unlock()
	got, ok := a.lines[pod.Name]
	if !ok || id == "" || got.podUID != pod.UID || got.containerID != id {
		return "", false
	}
	return got.line, true
}

// candidate is the line read for the pod of this name and the address that pod had, whichever
// pod of the name it was: enough to start connecting (ClaimRequest.Ahead), never to trust, which
// takes Lookup.
func (a *AgentLines) candidate(name string) (podIP, line string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	got, ok := a.lines[name]
	return got.podIP, got.line, ok && got.podIP != ""
}

func (a *AgentLines) setWatching(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.watching = on
	clear(a.adopted)
}

// seen keeps an adopted Sandbox as the watch shows it and hands it to the claim waiting for it.
func (a *AgentLines) seen(event watch.EventType, sbx *sandboxv1beta1.Sandbox) {
	claimUID := types.UID(sbx.Labels[extv1beta1.SandboxIDLabel])
	if claimUID == "" {
		return // a pool sandbox nobody adopted yet
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if event == watch.Deleted {
		if kept := a.adopted[claimUID]; kept != nil && kept.Name == sbx.Name {
			delete(a.adopted, claimUID)
		}
		return
	}
	a.adopted[claimUID] = sbx
	for w := range a.waiting {
		if adoptedAndReady(sbx, w.claim) {
			w.found <- sbx
			delete(a.waiting, w)
		}
	}
}

// adoption is watchAdoption on the watch that runs already: the channel yields the Sandbox the
// claim adopted once it is Ready, and stop ends the wait. ok is false while nothing is watched
// (the watch is starting again after an error): the caller watches itself.
func (a *AgentLines) adoption(claim *extv1beta1.SandboxClaim) (found <-chan *sandboxv1beta1.Sandbox, stop func(), ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.watching {
		return nil, nil, false
	}
	w := &adoptionWait{claim: claim, found: make(chan *sandboxv1beta1.Sandbox, 1)}
	if sbx := a.adopted[claim.UID]; sbx != nil && adoptedAndReady(sbx, claim) {
		w.found <- sbx
		return w.found, func() {}, true
	}
	a.waiting[w] = struct{}{}
	return w.found, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.waiting, w)
	}, true
}

// kept is how many lines are kept.
func (a *AgentLines) kept() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.lines)
}

func (a *AgentLines) has(pod string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.lines[pod]
	return ok
}

func (a *AgentLines) forget(pod string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.lines, pod)
}

// containerID is the ID of the running instance of the pod's job container (its first), "" if
// it is not running.
func containerID(pod *corev1.Pod) string {
	if len(pod.Spec.Containers) == 0 {
		return ""
	}
	cs := containerStatus(pod, pod.Spec.Containers[0].Name)
	if cs == nil || cs.State.Running == nil {
		return ""
	}
	return cs.ContainerID
}
