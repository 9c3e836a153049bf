//go:build soak

// Package soak runs hundreds of jobs of mixed kinds through the chart's in-cluster install while
// a seeded schedule of faults lands on the cluster, and checks the executor's promises over
// every job of the run (docs/reliability.md).
package soak

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/packetcapture"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/records"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

func TestMain(m *testing.M) { clusterjobs.SuiteMain(m, "soak") }

const (
	// hangMargin is how long past its timeout a job may take to end (the runner's own grace,
	// cleanup, a fault's recovery) before it counts as hung.
	hangMargin = 3 * time.Minute
	// queueBound is how long a job may wait to be handed out once the fake GitLab has it.
	queueBound = 10 * time.Minute
	// meanGap is the mean time between two hand-outs outside bursts: about what the 2-core
	// local cluster serves with faults landing on it (at 3 s, two 200-job runs piled up a
	// backlog that jobs waited over 10 minutes in), so that faults land on jobs all through
	// the run, not on a queue.
	meanGap = 6 * time.Second
	// maxQueued is how many jobs may wait at the fake GitLab at once: beyond it the schedule
	// is held back rather than a backlog built (a burst still fills the runner's slots twice).
	maxQueued = 2 * concurrent
	// The local cluster's "internet" and the link in front of it (tests/cluster/networkpolicy.sh).
	internet    = "10.99.0.2"
	outsideLink = "sbx-out0"
	// poolReplicas is the release's warm pool; the runner takes concurrent jobs at once.
	poolReplicas = 3
	concurrent   = 4
	// readyTimeout is the executor's ready_timeout (soakValues); jobTimeout leaves a job that
	// waited it out time to run.
	readyTimeout = "4m"
)

// podNetwork is the local cluster's pod network (tests/cluster).
var podNetwork = netip.MustParsePrefix("10.88.0.0/16")

// reached is the egress kind's own line saying it got through (not the echo of the command
// that says it). The flow kind's "egress outside" check is written for direct pods: through a
// proxy, curl without -f takes the proxy's 403 for an answer, so its line says nothing here.
var reached = regexp.MustCompile(`(?m)^(direct|proxied): REACHED\r?$`)

// settings are the run's: SOAK_JOBS jobs (default 30), SOAK_SEED (default: the time; logged,
// so any run can be replayed), SOAK_REPORT (where the markdown report goes; default none).
type settings struct {
	jobs   int
	seed   uint64
	report string
}

func readSettings(t *testing.T) settings {
	s := settings{jobs: 30, seed: uint64(time.Now().UnixNano()), report: os.Getenv("SOAK_REPORT")}
	if v := os.Getenv("SOAK_JOBS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SOAK_JOBS=%q: want a positive number of jobs", v)
		}
		s.jobs = n
	}
	if v := os.Getenv("SOAK_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: want an unsigned integer", v)
		}
		s.seed = n
	}
	return s
}

// soakValues are the release's values over chartinstall's: the chart's own default of a proxied
// template (each job granted its instance by the egress proxy), a pool of poolReplicas, the
// runner's concurrent jobs, the exporter on, a short claim_grace (the pods of jobs whose runner
// was killed live until their job's timeout plus claim_grace, using the node meanwhile) and a
// long readyTimeout: unlike a user's, the local node has 2 CPUs, on which a cold pod beside the
// soak's load took up to 2 minutes to start (the chart's default ready_timeout).
func soakValues(image string) string {
	// The fence check of a proxied template: the proxy answers (allow empty), the internet not.
	return fmt.Sprintf(`jobDefaults:
  fence:
    deny: ["%[4]s:80"]
    allow: []
templates:
  - name: duo-gvisor
    image: %[1]s
    egress: proxied
pools:
  - name: duo-default
    template: duo-gvisor
    replicas: %[2]d
    images: ["%[1]s"]
    egressInstance: true
executor:
  claimGrace: 30s
  readyTimeout: %[5]s
runner:
  concurrent: %[3]d
exporter:
  enabled: true
`, image, poolReplicas, concurrent, internet, readyTimeout)
}

// run is the soak's state while it runs.
type run struct {
	t      *testing.T
	inst   *duoflow.Instance
	start  time.Time
	mu     sync.Mutex
	jobs   []*soakJob
	faults []*fault
	// restarts are the daemons the supervisor started again, and when.
	restarts []string
}

func TestSoak(t *testing.T) {
	s := readSettings(t)
	t.Logf("soak: %d jobs, seed %d (SOAK_JOBS=%d SOAK_SEED=%d replays this run)", s.jobs, s.seed, s.jobs, s.seed)
	rng := rand.New(rand.NewPCG(s.seed, 0))
	c := clusterjobs.Connect(t)
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	inst, err := duoflow.NewInstance()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	base, err := inst.CreateProject()
	if err != nil {
		t.Fatal(err)
	}
	sentinelBytes := make([]byte, 12)
	for i := range sentinelBytes {
		sentinelBytes[i] = byte(rng.IntN(256))
	}
	sentinel := "soak-sentinel-" + hex.EncodeToString(sentinelBytes)
	// Not from rng: a run's schedule stays what its seed says.
	idToken, err := fakegitlab.NewIDToken(inst.GitLab.URL(), "https://vault.example.com", "project_path:"+duoflow.Project+":ref_type:branch:ref:main", time.Now())
	if err != nil {
		t.Fatal(err)
	}

	suffix := strconv.Itoa(os.Getpid())
	image := localcluster.CIImage
	r, err := chartinstall.Install(ctx, chartinstall.Options{Root: root, Env: c.Env, Kube: c.Admin.Kube,
		Namespace: "sbx-soak-" + suffix, GitLabNamespace: "sbx-soak-gitlab-" + suffix, Release: "soak",
		InstanceIP: inst.Host, RunnerToken: inst.GitLab.RunnerToken(), JobImage: image, ExtraValues: soakValues(image)})
	if r != nil {
		t.Cleanup(func() {
			if !r.Uninstalled() {
				if err := r.Uninstall(); err != nil {
					t.Error(err)
				}
			}
			if err := r.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	ns := r.Namespace
	recorder := records.Namespace(t, c.Admin, ns)
	packets := packetcapture.To(t, outsideLink, internet)

	// The install works before any fault: one hello job.
	all := kinds(inst, base, image, sentinel, idToken)
	warmup := all[0].build(&soakJob{salt: 1})
	inst.GitLab.Enqueue(warmup)
	if res := waitJob(t, inst, r, warmup.ID); res.State != fakegitlab.StateSuccess {
		t.Fatalf("the first job of the install: %s (%s)\n%s\nrunner log:\n%s", res.State, res.FailureReason, res.Trace, r.RunnerLog())
	}

	jobs := plan(rng, all, s.jobs, meanGap)
	span := jobs[len(jobs)-1].due + 20*time.Second
	faults := schedule(rng, max(4, s.jobs/7), span)
	for _, f := range faults {
		t.Logf("scheduled: %s", f)
	}
	t.Logf("scheduled: %d jobs over %s (%s)", len(jobs), jobs[len(jobs)-1].due.Round(time.Second), kindCounts(jobs))

	ru := &run{t: t, inst: inst, jobs: jobs, faults: faults, start: time.Now()}
	inj := &injector{r: r, admin: c.Admin, pool: "duo-default", logf: t.Logf, runnerKilled: ru.abandonInFlight}
	faultCtx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	// Ends when every job has settled: a targeted fault still waiting for a job pod is skipped.
	jobsCtx, jobsSettled := context.WithCancel(faultCtx)
	defer jobsSettled()
	injecting := inj.run(faultCtx, jobsCtx, ru.start, faults)
	superviseCtx, stopSupervising := context.WithCancel(ctx)
	supervising := supervise(superviseCtx, func(daemon string) {
		ru.mu.Lock()
		defer ru.mu.Unlock()
		ru.restarts = append(ru.restarts, fmt.Sprintf("%s at +%s", daemon, time.Since(ru.start).Round(time.Second)))
		t.Logf("supervisor: %s had exited; started it again", daemon)
	})
	go ru.handOut(all)
	ru.waitAll()
	jobsSettled()
	injecting.Wait()
	stopSupervising()
	supervising.Wait()
	runEnd := time.Now()
	took := runEnd.Sub(ru.start)
	t.Logf("all %d jobs settled and all %d faults over in %s", len(jobs), len(faults), took.Round(time.Second))

	v := &violations{}
	// The cluster whole again (each fault mends what it broke; this proves it).
	if err := clusterjobs.WaitWhole(ctx, 5*time.Minute); err != nil {
		v.add(invHealthy, "the cluster after the run: %v", err)
	}
	for _, s := range jobs {
		ru.checkJob(v, s)
	}
	ru.checkHealthy(v, r)
	ru.checkNothingLeft(v, r, c.Admin)
	ru.checkExporter(v, r)
	ru.checkSecrets(v, r, c.Admin, recorder, map[string]string{"the masked sentinel": sentinel, "the ID token": idToken, "the ID token's signature": idToken[strings.LastIndex(idToken, ".")+1:]})
	for src, n := range packets.Sources(ru.start, runEnd) {
		// This machine's own checks (networkpolicy.sh's positive control after a policy fault)
		// come from its side of the link; pods' packets keep their pod address.
		if a, err := netip.ParseAddr(src); err != nil || podNetwork.Contains(a) {
			v.add(invInternet, "%s sent %d packets that reached %s", src, n, internet)
		}
	}
	for _, s := range jobs {
		if reached.MatchString(s.result.Trace) {
			v.add(invInternet, "job %d (%s) says it reached the outside:\n%s", s.id, s.kind.name, tail(s.result.Trace, 20))
		}
	}

	rep := report(s, jobs, faults, v, took, ru.restarts)
	t.Log("\n" + rep)
	if s.report != "" {
		if err := os.WriteFile(s.report, []byte(rep), 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, inv := range invariants {
		for _, msg := range v.byInvariant[inv] {
			t.Errorf("violation of %q: %s", inv, msg)
		}
	}
	if err := r.Uninstall(); err != nil {
		t.Error(err)
	}
}

// handOut gives each job to the fake GitLab at its time, or once fewer than maxQueued jobs wait
// there, and cancels the cancel kind's jobs cancelDelay after their script started.
func (ru *run) handOut(all []*kind) {
	for _, s := range ru.jobs {
		time.Sleep(time.Until(ru.start.Add(s.due)))
		for ru.queued() >= maxQueued {
			time.Sleep(500 * time.Millisecond)
		}
		job := s.kind.build(s)
		ru.mu.Lock()
		s.id = job.ID
		s.enqueued = time.Now()
		s.timeout = time.Duration(job.RunnerInfo.Timeout) * time.Second
		ru.mu.Unlock()
		ru.inst.GitLab.Enqueue(job)
		if s.kind.cancel {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), jobTimeout+hangMargin)
				defer cancel()
				if _, err := ru.inst.GitLab.WaitForTrace(ctx, s.id, "tick 1"); err != nil {
					return // it ended before its script ran (a fault): nothing to cancel
				}
				time.Sleep(s.cancelDelay)
				_ = ru.inst.GitLab.Cancel(s.id)
			}()
		}
	}
}

// queued counts the jobs the fake GitLab has and no runner has taken yet.
func (ru *run) queued() int {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	n := 0
	for _, s := range ru.jobs {
		if s.id == 0 || s.settled {
			continue
		}
		if res, err := ru.inst.GitLab.Snapshot(s.id); err == nil && res.HandedOutAt.IsZero() {
			n++
		}
	}
	return n
}

// waitAll returns once every job has ended, was abandoned with its runner, or overran its bound.
func (ru *run) waitAll() {
	for {
		pending := 0
		ru.mu.Lock()
		for _, s := range ru.jobs {
			if s.settled {
				continue
			}
			if s.id == 0 {
				pending++
				continue
			}
			res, err := ru.inst.GitLab.Snapshot(s.id)
			if err != nil {
				pending++
				continue
			}
			s.result = res
			switch {
			case !res.FinishedAt.IsZero():
				s.settled, s.ended = true, true
			case s.abandoned:
				s.settled = true
			case !res.HandedOutAt.IsZero() && time.Since(res.HandedOutAt) > s.timeout+hangMargin:
				s.settled = true // hung: ended stays false
			case res.HandedOutAt.IsZero() && time.Since(s.enqueued) > queueBound:
				s.settled = true // never handed out
			default:
				pending++
			}
		}
		ru.mu.Unlock()
		if pending == 0 {
			return
		}
		time.Sleep(time.Second)
	}
}

// abandonInFlight is told that the runner pod was killed at at: the jobs it held can no longer
// end (GitLab would drop them as stuck), so the soak stops waiting for them.
func (ru *run) abandonInFlight(at time.Time) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	for _, s := range ru.jobs {
		if s.id == 0 || s.settled {
			continue
		}
		if res, err := ru.inst.GitLab.Snapshot(s.id); err == nil && !res.HandedOutAt.IsZero() && !res.HandedOutAt.After(at) && res.FinishedAt.IsZero() {
			s.abandoned = true
			ru.t.Logf("job %d (%s) abandoned: its runner was killed at %s", s.id, s.kind.name, at.Format("15:04:05.000"))
		}
	}
}

// waitJob waits for one job outside the run (the warm-up, the health check).
func waitJob(t *testing.T, inst *duoflow.Instance, r *chartinstall.Release, id int64) fakegitlab.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := inst.GitLab.Wait(ctx, id)
	if err != nil {
		t.Fatalf("job %d: %v\ntrace so far:\n%s\nrunner log:\n%s", id, err, res.Trace, r.RunnerLog())
	}
	return res
}

// checkJob holds one job to the invariants about jobs.
func (ru *run) checkJob(v *violations, s *soakJob) {
	res := s.result
	var hitBy []*fault
	for _, f := range ru.faults {
		if f.hits(s, res.HandedOutAt, res.FinishedAt) {
			hitBy = append(hitBy, f)
		}
	}
	s.faulted = len(hitBy) > 0
	about := func() string {
		var b strings.Builder
		fmt.Fprintf(&b, "job %d (%s, #%d): %s", s.id, s.kind.name, s.index, describe(res))
		for _, f := range ru.faults {
			if !f.begin.IsZero() && res.HandedOutAt.Before(f.end.Add(settle)) && (res.FinishedAt.IsZero() || res.FinishedAt.After(f.begin.Add(-settle))) {
				fmt.Fprintf(&b, "\n  around it: %s (%s to %s)", f, f.begin.Format("15:04:05.000"), f.end.Format("15:04:05.000"))
			}
		}
		fmt.Fprintf(&b, "\n  trace (end):\n%s", tail(res.Trace, 40))
		return b.String()
	}
	if !s.ended && !s.abandoned {
		v.add(invEnds, "%s", about())
		return
	}
	if s.ended {
		if !res.HandedOutAt.IsZero() && res.Duration() > s.timeout+hangMargin {
			v.add(invEnds, "took %s, past its timeout %s + %s: %s", res.Duration().Round(time.Second), s.timeout, hangMargin, about())
		}
	}
	if res.State == fakegitlab.StateSuccess {
		if s.kind.exact == nil {
			v.add(invExact, "a kind that must fail succeeded: %s", about())
		} else if err := s.kind.exact(s, res); err != nil {
			v.add(invExact, "success without its exact output (%v): %s", err, about())
		}
	}
	if s.kind.cancel && res.State == fakegitlab.StateCanceled {
		if err := checkTicks(res.Trace); err != nil {
			v.add(invExact, "canceled with its output garbled (%v): %s", err, about())
		}
	}
	if s.abandoned && !s.ended {
		return
	}
	want := s.kind.want(s)
	switch {
	case matches(res, want):
	case !s.faulted:
		v.add(invUnfaulted, "no fault touched it, yet it ended %s, want %s: %s", describe(res), want, about())
	case res.State == fakegitlab.StateFailed && (res.FailureReason == fakegitlab.FailureSystem || res.FailureReason == fakegitlab.FailureTimeout):
		// A fault may end a job as a system failure, or keep it past its timeout.
	default:
		v.add(invFaulted, "hit by a fault, it ended %s, want %s or a system failure: %s", describe(res), want, about())
	}
}

func matches(res fakegitlab.Result, want outcome) bool {
	if res.State != want.state {
		return false
	}
	if want.reason == "" {
		return true
	}
	if res.FailureReason != want.reason {
		return false
	}
	return want.reason != fakegitlab.FailureScript || (res.ExitCode != nil && *res.ExitCode == want.exit)
}

func describe(res fakegitlab.Result) string {
	switch {
	case res.HandedOutAt.IsZero():
		return "never handed out"
	case res.FinishedAt.IsZero():
		return "not ended (" + res.State + ")"
	case res.State == fakegitlab.StateFailed && res.FailureReason == fakegitlab.FailureScript && res.ExitCode != nil:
		return fmt.Sprintf("failed (%s, exit %d) in %s", res.FailureReason, *res.ExitCode, res.Duration().Round(time.Millisecond))
	case res.FailureReason != "":
		return fmt.Sprintf("%s (%s) in %s", res.State, res.FailureReason, res.Duration().Round(time.Millisecond))
	}
	return fmt.Sprintf("%s in %s", res.State, res.Duration().Round(time.Millisecond))
}

// checkHealthy: the runner pod is Ready, its stage server listening and never stopped, and a
// job after the run succeeds through it.
func (ru *run) checkHealthy(v *violations, r *chartinstall.Release) {
	if _, err := r.Kubectl("-n", r.Namespace, "rollout", "status", "deploy/"+r.Fullname()+"-runner", "--timeout=3m"); err != nil {
		v.add(invHealthy, "the runner Deployment: %v", err)
		return
	}
	job := ru.jobsKind("hello").build(&soakJob{salt: 2})
	ru.inst.GitLab.Enqueue(job)
	// A violation, not a fatal error: the report is written whatever the end looks like.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := ru.inst.GitLab.Wait(ctx, job.ID)
	log := r.WholeRunnerLog()
	switch {
	case err != nil:
		v.add(invHealthy, "a job after the run did not end within 5 minutes (%v); the runner's log ends:\n%s", err, tail(log, 60))
	case res.State != fakegitlab.StateSuccess:
		v.add(invHealthy, "a job after the run: %s\n%s", describe(res), tail(res.Trace, 40))
	case strings.Contains(res.Trace, "runs in its own process"):
		v.add(invHealthy, "a job after the run did not reach the stage server:\n%s", tail(res.Trace, 40))
	case !strings.Contains(log, "stage server: listening on "):
		v.add(invHealthy, "the runner pod's stage server is not listening:\n%s", tail(log, 40))
	case strings.Contains(log, "the stage server stopped"):
		v.add(invHealthy, "the runner pod's stage server stopped:\n%s", tail(log, 40))
	}
}

func (ru *run) jobsKind(name string) *kind {
	for _, s := range ru.jobs {
		if s.kind.name == name {
			return s.kind
		}
	}
	ru.t.Fatalf("no job of kind %s in the run", name)
	return nil
}

// checkNothingLeft runs gc once (as an operator would after a runner died: everything older
// than a second, since nothing runs now), then waits for the run's claims, their sandboxes and
// pods to go, and asks the egress proxy for grants still in force.
func (ru *run) checkNothingLeft(v *violations, r *chartinstall.Release, admin *kube.Clients) {
	ns := r.Namespace
	out, err := r.Kubectl("-n", ns, "exec", "deploy/"+r.Fullname()+"-runner", "--", "/usr/local/bin/sandbox-executor",
		"--config", "/etc/sandbox-executor/config.toml", "gc", "--delete", "--older-than", "1s")
	ru.t.Logf("gc: %s", strings.TrimSpace(out))
	if err != nil {
		v.add(invLeftovers, "gc: %v", err)
	}
	var left []string
	ctx := context.Background()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		left = nil
		claims, err := admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, c := range claims.Items {
				left = append(left, "claim "+c.Name)
			}
		}
		sandboxes, err2 := admin.Sandboxes.AgentsV1beta1().Sandboxes(ns).List(ctx, metav1.ListOptions{})
		if err2 == nil {
			for _, sb := range sandboxes.Items {
				for _, ref := range sb.OwnerReferences {
					if ref.Kind == "SandboxClaim" {
						left = append(left, "sandbox "+sb.Name+" of claim "+ref.Name)
					}
				}
			}
		}
		pods, err3 := admin.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: jobPodSelector})
		if err3 == nil {
			for _, p := range pods.Items {
				left = append(left, "pod "+p.Name)
			}
		}
		if err == nil && err2 == nil && err3 == nil && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, l := range left {
				v.add(invLeftovers, "%s is left 3 minutes after gc", l)
			}
			if err != nil || err2 != nil || err3 != nil {
				v.add(invLeftovers, "listing what is left: %v %v %v", err, err2, err3)
			}
			break
		}
		time.Sleep(2 * time.Second)
	}
	proxy, stop, err := proxyAdmin(ctx, r, admin)
	if err != nil {
		v.add(invGrants, "reaching the egress proxy's admin API: %v", err)
		return
	}
	defer stop()
	grants, err := proxy.ListGrants(ctx)
	if err != nil {
		v.add(invGrants, "listing the egress proxy's grants: %v", err)
	}
	for _, g := range grants {
		v.add(invGrants, "pod %s still has a grant, until %s", g.Client, g.Until.Format(time.RFC3339))
	}
}

// proxyAdmin reaches the release's egress proxy's admin API through a port-forward (from the
// proxy pod's loopback: trusted without the token), over TLS verified with the release's CA
// for the proxy's Service name.
func proxyAdmin(ctx context.Context, r *chartinstall.Release, admin *kube.Clients) (*adminclient.Client, func(), error) {
	name := r.Fullname() + "-egress-proxy"
	secret, err := admin.Kube.CoreV1().Secrets(r.Namespace).Get(ctx, r.Fullname()+"-egress-admin-tls", metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(secret.Data["ca.crt"]) {
		return nil, nil, fmt.Errorf("secret %s has no ca.crt", secret.Name)
	}
	base, stop, err := portForward(r, "svc/"+name, 3129)
	if err != nil {
		return nil, nil, err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: name + "." + r.Namespace + ".svc", MinVersion: tls.VersionTLS12}}}
	return &adminclient.Client{Base: "https" + strings.TrimPrefix(base, "http"), HTTP: hc}, stop, nil
}

// exporterJobs reads sandbox_executor_jobs_total by outcome.
var exporterJobs = regexp.MustCompile(`(?m)^sandbox_executor_jobs_total\{([^}]*)\} (\d+)`)

var (
	outcomeLabel = regexp.MustCompile(`outcome="([a-z]+)"`)
	reasonLabel  = regexp.MustCompile(`reason="([a-z_]*)"`)
)

// checkExporter: the exporter counted, by outcome, the jobs the executor cleaned up. A job
// whose runner was killed, or whose cleanup a fault hit, may be missing from its count; no job
// may be counted that GitLab does not know with that outcome, but for jobs whose runner was
// killed before it sent their final state.
func (ru *run) checkExporter(v *violations, r *chartinstall.Release) {
	base, stop, err := portForward(r, "svc/"+r.Fullname()+"-exporter", 9090)
	if err != nil {
		v.add(invExporter, "reaching the exporter: %v", err)
		return
	}
	defer stop()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		v.add(invExporter, "the exporter's metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	// A prepare that fails is counted before the runner retries it: cleaned up without a state
	// (failed, prepare_failed), or released by prepare itself when the pod's fence check failed
	// (failed, fence_not_holding: a stream fault on the pod can fail it). Such attempts are
	// counted apart, GitLab sees one job.
	counted := map[string]int{}
	byReason := map[string]int{}
	retried := 0
	scanner := bufio.NewScanner(resp.Body)
	for scanner.Scan() {
		m := exporterJobs.FindStringSubmatch(scanner.Text())
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		outcome, reason := outcomeLabel.FindStringSubmatch(m[1]), reasonLabel.FindStringSubmatch(m[1])
		if outcome != nil && reason != nil && n > 0 {
			byReason[outcome[1]+"/"+reason[1]] += n
		}
		switch {
		case outcome == nil:
		case outcome[1] == fakegitlab.StateFailed && reason != nil && (reason[1] == kube.ReasonPrepare || reason[1] == kube.ReasonFence):
			retried += n
		default:
			counted[outcome[1]] += n
		}
	}
	// GitLab's final states, read now: a job abandoned with its killed runner may still have
	// been cleaned up (and counted) in the runner's grace, and sent its final state, or not.
	gitlab := map[string]int{}
	// The warm-up and the health check are jobs of the release too.
	gitlab[fakegitlab.StateSuccess] += 2
	faulted, unreported := 0, 0
	for _, s := range ru.jobs {
		res := s.result
		if s.id != 0 {
			if now, err := ru.inst.GitLab.Snapshot(s.id); err == nil {
				res = now
			}
		}
		switch {
		case !res.FinishedAt.IsZero():
			gitlab[res.State]++
		case s.abandoned:
			// Its runner died between cleanup and the final state, or before cleanup: the
			// exporter may have counted it under any outcome, or not at all.
			unreported++
		}
		if s.faulted || s.abandoned {
			faulted++
		}
	}
	over, short := 0, 0
	for _, outcome := range []string{fakegitlab.StateSuccess, fakegitlab.StateFailed, fakegitlab.StateCanceled} {
		if d := counted[outcome] - gitlab[outcome]; d > 0 {
			over += d
		} else {
			short -= d
		}
	}
	if over > unreported {
		v.add(invExporter, "the exporter counted %d jobs more than GitLab ended with those outcomes (counted %v, by reason %v, GitLab %v), more than the %d jobs whose runner died before their final state", over, counted, byReason, gitlab, unreported)
	}
	if short > faulted {
		v.add(invExporter, "the exporter missed %d jobs (counted %v, GitLab %v), more than the %d that faults touched", short, counted, gitlab, faulted)
	}
	ru.t.Logf("exporter: %v and %d failed prepare attempts (by outcome and reason: %v); GitLab: %v (%d jobs touched by faults, %d abandoned without a final state)", counted, retried, byReason, gitlab, faulted, unreported)
}

// checkSecrets searches every record of the run for each of secrets (by what they are): the
// namespace's objects and events in every version, the logs of every pod left, the
// controller's, and every trace.
func (ru *run) checkSecrets(v *violations, r *chartinstall.Release, admin *kube.Clients, recorder *records.Recorder, secrets map[string]string) {
	ctx := context.Background()
	for _, ns := range []string{r.Namespace, "agent-sandbox-system"} {
		pods, err := admin.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			v.add(invSentinel, "listing the pods of %s: %v", ns, err)
			continue
		}
		for _, p := range pods.Items {
			for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				// A container that never started has no log: nothing to search.
				log, err := admin.Kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name}).DoRaw(ctx)
				if err == nil {
					recorder.Add("log of "+ns+"/"+p.Name+"/"+c.Name, string(log))
				}
			}
		}
	}
	recorder.Add("runner log", r.WholeRunnerLog())
	for _, s := range ru.jobs {
		recorder.Add(fmt.Sprintf("trace of job %d", s.id), s.result.Trace)
	}
	recorder.Stop()
	for what, secret := range secrets {
		for _, found := range recorder.Containing(secret) {
			v.add(invSentinel, "%s is in %s", what, found)
		}
	}
	n, versions := recorder.Count()
	ru.t.Logf("searched %d records (%d versions) for the sentinel and the ID token", n, versions)
}

// portForward forwards a local port to target's port; it returns the base URL.
func portForward(r *chartinstall.Release, target string, port int) (string, func(), error) {
	cmd := exec.Command(r.Env.Dir+"/bin/kubectl", "--kubeconfig="+r.Env.AdminKubeconfig(), "-n", r.Namespace, "port-forward", target, ":"+strconv.Itoa(port))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	// "Forwarding from 127.0.0.1:40123 -> 3129"
	line, err := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`127\.0\.0\.1:(\d+) ->`).FindStringSubmatch(line)
	if err != nil || m == nil {
		stop()
		return "", nil, fmt.Errorf("kubectl port-forward %s: %q %v", target, line, err)
	}
	return "http://127.0.0.1:" + m[1], stop, nil
}

func tail(text string, lines int) string {
	all := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return "    " + strings.Join(all, "\n    ")
}
