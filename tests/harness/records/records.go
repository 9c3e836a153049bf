// Package records keeps what the cluster recorded of jobs (every version of a namespace's pods,
// claims, sandboxes and events, and the logs a suite adds), for suites to search for what must
// never be there: a job's secrets.
package records

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Recorder keeps what the cluster and the runner recorded of jobs: every version of the
// namespace's pods, SandboxClaims, Sandboxes and events that the API server reports while it
// records, and whatever else the test adds (container logs, the executor's output).
type Recorder struct {
	mu      sync.Mutex
	records map[string][]string
	deleted map[string]bool
	// changed is closed, and replaced, whenever an object is deleted.
	changed chan struct{}
	cancel  context.CancelFunc
	done    []<-chan struct{}
}

// Namespace starts recording the namespace's pods, claims, sandboxes and events, from their
// current versions on. client-go's RetryWatcher resumes after the API server ends a watch (a
// restart by another test), from the last version it saw, so no version in between is missed.
// Stop it before searching.
func Namespace(t testing.TB, admin *kube.Clients, namespace string) *Recorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &Recorder{records: map[string][]string{}, deleted: map[string]bool{}, changed: make(chan struct{}), cancel: cancel}
	t.Cleanup(c.Stop)
	pods := admin.Kube.CoreV1().Pods(namespace)
	claims := admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace)
	sandboxes := admin.Sandboxes.AgentsV1beta1().Sandboxes(namespace)
	events := admin.Kube.CoreV1().Events(namespace)
	for _, kind := range []struct {
		name  string
		list  func(context.Context, metav1.ListOptions) (runtime.Object, error)
		watch func(context.Context, metav1.ListOptions) (watch.Interface, error)
	}{
		{"pod", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pods.List(ctx, o) }, pods.Watch},
		{"claim", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return claims.List(ctx, o) }, claims.Watch},
		{"sandbox", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return sandboxes.List(ctx, o) }, sandboxes.Watch},
		{"event", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return events.List(ctx, o) }, events.Watch},
	} {
		if err := c.watch(ctx, kind.name, kind.list, kind.watch); err != nil {
			t.Fatalf("recording the namespace's %ss: %v", kind.name, err)
		}
	}
	return c
}

func (c *Recorder) watch(ctx context.Context, kind string, list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) error {
	current, err := list(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	items, err := meta.ExtractList(current)
	if err != nil {
		return err
	}
	for _, item := range items {
		c.addObject(kind, item)
	}
	listMeta, err := meta.ListAccessor(current)
	if err != nil {
		return err
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, listMeta.GetResourceVersion(), &cache.ListWatch{WatchFuncWithContext: watchFn})
	if err != nil {
		return err
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added, watch.Modified:
				c.addObject(kind, ev.Object)
			case watch.Deleted:
				c.addObject(kind, ev.Object)
				c.markDeleted(kind, ev.Object)
			}
		}
	}()
	c.done = append(c.done, w.Done(), read)
	return nil
}

func (c *Recorder) addObject(kind string, obj runtime.Object) {
	c.Add(recordName(kind, obj), obj)
}

func recordName(kind string, obj runtime.Object) string {
	if m, err := meta.Accessor(obj); err == nil {
		return kind + " " + m.GetName()
	}
	return kind + " ?"
}

func (c *Recorder) markDeleted(kind string, obj runtime.Object) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleted[recordName(kind, obj)] = true
	close(c.changed)
	c.changed = make(chan struct{})
}

// WaitDeleted waits until the recording has seen each of whats ("pod NAME", "claim NAME")
// deleted, so that it holds every version of them; it fails the test if ctx ends first.
func (c *Recorder) WaitDeleted(ctx context.Context, t testing.TB, whats ...string) {
	t.Helper()
	for {
		c.mu.Lock()
		var missing []string
		for _, what := range whats {
			if !c.deleted[what] {
				missing = append(missing, what)
			}
		}
		changed := c.changed
		c.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("the recording has not seen %s deleted: %v", strings.Join(missing, ", "), ctx.Err())
		}
	}
}

// Add keeps record under what: a string as it is, anything else as its JSON.
func (c *Recorder) Add(what string, record any) {
	text, ok := record.(string)
	if !ok {
		data, err := json.Marshal(record)
		if err != nil {
			text = fmt.Sprintf("%+v", record)
		} else {
			text = string(data)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records[what] = append(c.records[what], text)
}

// Stop ends the recording and waits for its watches to end.
func (c *Recorder) Stop() {
	c.cancel()
	for _, done := range c.done {
		<-done
	}
	c.done = nil
}

// Has tells whether something was recorded under what.
func (c *Recorder) Has(what string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.records[what]) > 0
}

// Containing names the records that contain s, with how many of their versions do.
func (c *Recorder) Containing(s string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var found []string
	for what, versions := range c.records {
		n := 0
		for _, text := range versions {
			if strings.Contains(text, s) {
				n++
			}
		}
		if n > 0 {
			found = append(found, fmt.Sprintf("%s (%d of %d versions)", what, n, len(versions)))
		}
	}
	sort.Strings(found)
	return found
}

// Count is how many records, and versions of them, were kept.
func (c *Recorder) Count() (records, versions int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.records {
		versions += len(v)
	}
	return len(c.records), versions
}
