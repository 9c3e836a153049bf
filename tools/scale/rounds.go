package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/kube"
)

// The rounds: N claims at once, their Ready times from one watch, and the clean-up between them.

// settingList is the controller settings to run: those asked for, or the controller as found.
func (b *bench) settingList() [][]string {
	if b.o.settings == nil {
		return [][]string{nil}
	}
	return b.o.settings
}

// settings runs the rounds once per controller setting.
func (b *bench) settings(ctx context.Context) error {
	round := 0
	for i, extra := range b.settingList() {
		if err := b.ctrl.Apply(ctx, extra); err != nil {
			return err
		}
		if err := b.rounds(ctx, i, &round); err != nil {
			return err
		}
	}
	return nil
}

// rounds runs the warm and cold rounds of one controller setting; round numbers the rounds of
// the whole run (claim names derive from it).
func (b *bench) rounds(ctx context.Context, setting int, round *int) error {
	for _, kind := range []struct {
		warm   bool
		counts []int
	}{{true, b.o.warm}, {false, b.o.cold}} {
		for _, n := range kind.counts {
			*round++
			r, err := b.round(ctx, *round, n, kind.warm)
			if r != nil {
				r.setting = setting
				b.rows = append(b.rows, *r)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// result is one round.
type result struct {
	// setting indexes the controller setting the round ran with.
	setting            int
	warm               bool
	n, ok, warmHits    int
	errs               []string
	poolFill, wall     time.Duration
	cleanup            time.Duration
	ready, claim       []time.Duration
	cpu                map[string]float64
	apfWait, apfReject float64
	apfDispatched      float64
	queueWait, work    map[string]float64
	// writes counts the API server's mutating requests during the burst, by resource.
	writes map[string]float64
	// serverMean is the API server's own mean time for a non-watch request on agent-sandbox
	// resources (nearly all of them the controller's): what its reconciles wait for, server side.
	serverMean float64
	load       string
	// workers is what the controller said its workers were, after the burst.
	workers string
	// controllerRestarted: the controller's container was not the same after the burst.
	controllerRestarted bool
}

func (b *bench) round(ctx context.Context, idx, n int, warm bool) (*result, error) {
	r := &result{warm: warm, n: n}
	kind := kindName(warm)
	logf("round %d: %s, %d claims", idx, kind, n)
	// Fill (or empty) the pool first, and wait until it is Ready.
	size := 0
	if warm {
		size = n
	}
	fillStart := time.Now()
	if err := b.setPool(ctx, size); err != nil {
		return nil, err
	}
	if err := b.waitPool(ctx, size); err != nil {
		return nil, err
	}
	r.poolFill = time.Since(fillStart)
	logf("pool at %d Ready after %s", size, r.poolFill.Round(time.Millisecond))

	claimers, err := b.claimers(ctx, n)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range claimers {
			c.close()
		}
	}()

	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	jobID := func(i int) int64 { return int64(idx*100000 + i) }
	// The bench's jobs have no token: their claims are unbound, named by runner and job ID.
	claimName := func(i int) string { return kube.ClaimName("", runnerName, jobID(i)) }
	names := map[string]bool{}
	for i := range n {
		names[claimName(i)] = true
	}
	readyAt, allReady, err := b.watchReady(watchCtx, names)
	if err != nil {
		return nil, err
	}

	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		r.load = strings.Join(strings.Fields(string(raw))[:3], " ")
	}
	before := b.snapshot(ctx)
	starts := make([]time.Time, n)
	ends := make([]time.Time, n)
	results := make([]*kube.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			starts[i] = time.Now()
			results[i], errs[i] = claimers[i].claimer.Claim(ctx, kube.ClaimRequest{
				Namespace:      b.o.namespace,
				Name:           claimName(i),
				Pool:           poolName,
				Runner:         runnerName,
				Job:            kube.Job{ID: jobID(i), Timeout: time.Hour},
				Grace:          5 * time.Minute,
				ReadyTimeout:   b.o.roundTimeout,
				RuntimeClasses: []string{"gvisor"},
			})
			ends[i] = time.Now()
		})
	}
	begin := time.Now()
	close(gate)
	wg.Wait()
	last := slices.MaxFunc(ends, time.Time.Compare)
	r.wall = last.Sub(begin)
	// The shared watch may trail the per-claim ones by a moment.
	select {
	case <-allReady:
	case <-time.After(30 * time.Second):
	}
	stopWatch()
	after := b.snapshot(ctx)
	r.diff(before, after, b.priorityLevel)
	if r.controllerRestarted {
		b.ctrl.logRestart(ctx)
	}

	seen, late := readyAt()
	if late > 0 {
		logf("round %d: %d claims were first seen Ready in a re-list (their Ready time is late)", idx, late)
	}
	for i := range n {
		if errs[i] != nil {
			r.errs = append(r.errs, errs[i].Error())
			continue
		}
		r.ok++
		// A hit is a pool sandbox, Ready or still booting when adopted, as agent-sandbox's
		// launch-type label counted before prepare told the two apart.
		if results[i].Launch != kube.LaunchCold {
			r.warmHits++
		}
		r.claim = append(r.claim, ends[i].Sub(starts[i]))
		if t, ok := seen[results[i].Claim]; ok {
			r.ready = append(r.ready, t.Sub(starts[i]))
		}
	}
	slices.Sort(r.ready)
	slices.Sort(r.claim)
	logf("round %d: %d/%d Ready in %s, %d errors", idx, r.ok, n, r.wall.Round(time.Millisecond), len(r.errs))

	cleanStart := time.Now()
	err = b.cleanRound(ctx, claimers, names)
	r.cleanup = time.Since(cleanStart)
	logf("round %d: cleanup took %s", idx, r.cleanup.Round(time.Millisecond))
	return r, err
}

// waitPool waits until the pool's status and its sandboxes agree it holds size Ready sandboxes.
func (b *bench) waitPool(ctx context.Context, size int) error {
	pools := b.ext.ExtensionsV1beta1().SandboxWarmPools(b.o.namespace)
	return waitFor(ctx, b.o.roundTimeout, fmt.Sprintf("pool %s at %d Ready", poolName, size), func() (bool, string, error) {
		p, err := pools.Get(ctx, poolName, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		sbxs, err := b.sbx.AgentsV1beta1().Sandboxes(b.o.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		state := fmt.Sprintf("status %d/%d Ready, %d sandboxes", p.Status.ReadyReplicas, size, len(sbxs.Items))
		return int(p.Status.ReadyReplicas) == size && len(sbxs.Items) == size, state, nil
	})
}

// cleanRound empties the pool and releases every claim at once, each through its own claimer as
// N jobs' cleanup would (the sandboxes and pods are garbage-collected with the claims), then waits
// until the namespace holds no claim, sandbox or pod.
func (b *bench) cleanRound(ctx context.Context, claimers []claimer, names map[string]bool) error {
	if err := b.setPool(ctx, 0); err != nil {
		return err
	}
	errs := make([]error, len(claimers))
	var wg sync.WaitGroup
	i := 0
	for name := range names {
		c, slot := claimers[i], &errs[i]
		wg.Go(func() { *slot = c.claimer.Release(ctx, b.o.namespace, name, kube.AnyJob, kube.Outcome{}) })
		i++
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return waitFor(ctx, b.o.roundTimeout, "round cleanup", func() (bool, string, error) {
		claims, err := b.ext.ExtensionsV1beta1().SandboxClaims(b.o.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		sbxs, err := b.sbx.AgentsV1beta1().Sandboxes(b.o.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		pods, err := b.kube.CoreV1().Pods(b.o.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		left := len(claims.Items) + len(sbxs.Items) + len(pods.Items)
		return left == 0, fmt.Sprintf("%d claims, %d sandboxes, %d pods left", len(claims.Items), len(sbxs.Items), len(pods.Items)), nil
	})
}

// watchReady watches the claims of the namespace and records when each of the named ones first
// turned Ready with a sandbox (claims of an earlier round may still be there, being deleted).
// allReady closes once all have. A watch the API server ends is resumed from
// the last resource version seen; only if that is too old does it re-list, and claims first seen
// Ready in a re-list are stamped late (counted in relisted).
func (b *bench) watchReady(ctx context.Context, names map[string]bool) (readyAt func() (map[string]time.Time, int), allReady <-chan struct{}, err error) {
	claims := b.ext.ExtensionsV1beta1().SandboxClaims(b.o.namespace)
	var mu sync.Mutex
	seen := map[string]time.Time{}
	relisted := 0
	done := make(chan struct{})
	record := func(c *extv1beta1.SandboxClaim, now time.Time, fromList bool) {
		cond := meta.FindStatusCondition(c.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady))
		if !names[c.Name] || cond == nil || cond.Status != metav1.ConditionTrue || c.Status.SandboxStatus.Name == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if _, dup := seen[c.Name]; dup {
			return
		}
		seen[c.Name] = now
		if fromList {
			relisted++
		}
		if len(seen) == len(names) {
			close(done)
		}
	}
	relist := func() (string, error) {
		list, err := claims.List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		now := time.Now()
		for i := range list.Items {
			record(&list.Items[i], now, true)
		}
		return list.ResourceVersion, nil
	}
	rv, err := relist()
	if err != nil {
		return nil, nil, err
	}
	go func() {
		for ctx.Err() == nil {
			w, err := claims.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				now := time.Now()
				if ev.Type == watch.Error {
					if ctx.Err() == nil {
						logf("claims watch: %v; re-listing", apierrors.FromObject(ev.Object))
						if fresh, err := relist(); err == nil {
							rv = fresh
						}
					}
					break
				}
				c, ok := ev.Object.(*extv1beta1.SandboxClaim)
				if !ok {
					continue
				}
				rv = c.ResourceVersion
				if ev.Type != watch.Deleted && ev.Type != watch.Bookmark {
					record(c, now, false)
				}
			}
			w.Stop()
		}
	}()
	return func() (map[string]time.Time, int) {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen), relisted
	}, done, nil
}
