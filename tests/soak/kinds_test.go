//go:build soak

package soak

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// jobTimeout is runner_info.timeout of every job but the timeout kind's: long enough for a job
// that waits out a fault or a cold start (up to readyTimeout), short enough that a lost one ends
// the run.
const jobTimeout = 6 * time.Minute

// shortTimeout is the timeout kind's runner_info.timeout.
const shortTimeout = 25 * time.Second

// sentinelVariable is a masked variable every job carries (and some print): its value must
// never be found in a trace, a cluster record or a log. idTokenVariable is another, an ID
// token as a flow's id_tokens entry brings it (a JWT; fakegitlab.NewIDToken): neither it nor
// its signature may be found either.
const (
	sentinelVariable = "SOAK_SENTINEL"
	idTokenVariable  = "GITLAB_OIDC_TOKEN"
)

// outcome is what a job must end as when no fault touched it.
type outcome struct {
	state  string // fakegitlab.StateSuccess, StateFailed, StateCanceled
	reason string // the failure reason, when state is failed ("" : any)
	exit   int    // the script's exit code, when reason is script_failure
}

func (o outcome) String() string {
	switch {
	case o.state == fakegitlab.StateFailed && o.reason == fakegitlab.FailureScript:
		return fmt.Sprintf("failed (%s, exit %d)", o.reason, o.exit)
	case o.reason != "":
		return o.state + " (" + o.reason + ")"
	}
	return o.state
}

// kind is one sort of job the soak hands out: how to build it, what it must end as, and how its
// trace (and artifacts) prove that it did what it printed.
type kind struct {
	name   string
	weight int
	// build makes the job GitLab hands out.
	build func(s *soakJob) fakegitlab.Job
	// want is the outcome without faults.
	want func(s *soakJob) outcome
	// exact checks that a job that reports success holds exactly what it printed; nil when the
	// kind never succeeds.
	exact func(s *soakJob, res fakegitlab.Result) error
	// cancel: the soak cancels the job cancelDelay after its script started.
	cancel bool
	// abusive kinds are faults of their own (disk, memory): they must fail, any way they like.
	abusive bool
}

// soakJob is one job of the run: its plan and, once over, what GitLab knows of it.
type soakJob struct {
	index int
	kind  *kind
	id    int64
	// salt makes its output its own; exit and lines vary by kind.
	salt        int64
	exit        int
	lines       int
	cancelDelay time.Duration
	// due is when the job is handed to the fake GitLab, from the start of the run.
	due time.Duration

	// enqueued is when it was handed to the fake GitLab, timeout its runner_info.timeout.
	enqueued time.Time
	timeout  time.Duration

	result fakegitlab.Result
	// settled: the soak no longer waits for it; faulted: a fault may have touched it.
	settled, faulted bool
	// abandoned is set when the runner that held the job was killed: GitLab would drop it as
	// stuck; the soak stops waiting for it.
	abandoned bool
	// ended is false when the job did not end within the run's bound.
	ended bool
}

// kinds are the job kinds, with their weights in the mix. Every job carries the sentinel and the
// ID token as masked variables.
func kinds(inst *duoflow.Instance, base, image, sentinel, idToken string) []*kind {
	masked := []fakegitlab.Variable{{Key: sentinelVariable, Value: sentinel, Masked: true}, {Key: idTokenVariable, Value: idToken, Masked: true}}
	withTimeout := func(timeout time.Duration, script ...string) fakegitlab.Job {
		return inst.GitLab.NewJob(fakegitlab.JobSpec{Image: image, GitStrategy: "none", Timeout: timeout, Script: script,
			Variables: slices.Clone(masked)})
	}
	plain := func(_ *soakJob, script ...string) fakegitlab.Job { return withTimeout(jobTimeout, script...) }
	success := func(*soakJob) outcome { return outcome{state: fakegitlab.StateSuccess} }
	return []*kind{
		{
			name: "hello", weight: 20,
			build: func(s *soakJob) fakegitlab.Job {
				// The sentinel is printed: the runner masks it in the trace.
				return plain(s, fmt.Sprintf(`echo "hello %d $%s"`, s.salt, sentinelVariable))
			},
			want: success,
			exact: func(s *soakJob, res fakegitlab.Result) error {
				return mustHaveLine(res.Trace, fmt.Sprintf("hello %d [MASKED]", s.salt))
			},
		},
		{
			name: "numbered", weight: 18,
			build: func(s *soakJob) fakegitlab.Job {
				return plain(s, numberedScript(s.lines, s.salt))
			},
			want:  success,
			exact: func(s *soakJob, res fakegitlab.Result) error { return checkNumbered(res.Trace, s.lines, s.salt) },
		},
		{
			name: "exit", weight: 10,
			build: func(s *soakJob) fakegitlab.Job {
				return plain(s, fmt.Sprintf("echo 'exiting with %d'", s.exit), fmt.Sprintf("exit %d", s.exit))
			},
			want: func(s *soakJob) outcome {
				return outcome{state: fakegitlab.StateFailed, reason: fakegitlab.FailureScript, exit: s.exit}
			},
		},
		{
			name: "cancel", weight: 8, cancel: true,
			build: func(s *soakJob) fakegitlab.Job {
				return plain(s, `i=0; while :; do i=$((i+1)); echo "tick $i"; sleep 0.2; done`)
			},
			want: func(*soakJob) outcome { return outcome{state: fakegitlab.StateCanceled} },
		},
		{
			name: "timeout", weight: 5,
			build: func(s *soakJob) fakegitlab.Job {
				return withTimeout(shortTimeout, "echo 'sleeping past the timeout'", "sleep 600")
			},
			want: func(*soakJob) outcome {
				return outcome{state: fakegitlab.StateFailed, reason: fakegitlab.FailureTimeout}
			},
		},
		{
			name: "artifacts", weight: 8,
			build: func(s *soakJob) fakegitlab.Job {
				job := plain(s, "mkdir -p out", fmt.Sprintf("echo 'artifact %d' > out/a.txt", s.salt), "cat out/a.txt")
				job.Cache = []fakegitlab.Cache{{Key: "soak-cache", Paths: []string{"out/"}, Policy: "pull-push"}}
				job.Artifacts = []fakegitlab.Artifact{{Name: "soak", Paths: []string{"out/"}, When: fakegitlab.WhenOnSuccess, Type: "archive", Format: "zip"}}
				return job
			},
			want: success,
			exact: func(s *soakJob, res fakegitlab.Result) error {
				want := fmt.Sprintf("artifact %d", s.salt)
				if err := mustHaveLine(res.Trace, want); err != nil {
					return err
				}
				return checkArtifact(res, "out/a.txt", want+"\n")
			},
		},
		{
			name: "egress", weight: 6,
			build: func(s *soakJob) fakegitlab.Job {
				outside := localcluster.OutsideURL
				return plain(s,
					// Straight out, and through the pod's proxy: both must be refused.
					`if curl -sS --noproxy '*' --connect-timeout 3 --max-time 5 -o /dev/null `+outside+`; then echo "direct: REACHED"; else echo "direct: blocked"; fi`,
					`if curl -sS -f --connect-timeout 3 --max-time 5 -o /dev/null `+outside+`; then echo "proxied: REACHED"; else echo "proxied: blocked"; fi`,
					// The instance is the job's own grant: a real job retries a flaky network.
					`curl -fsS --retry 5 --retry-all-errors --retry-delay 1 -o /dev/null "${CI_SERVER_URL}/npm/`+duoflow.Dependency+`" && echo "instance: allowed"`)
			},
			want: success,
			exact: func(s *soakJob, res fakegitlab.Result) error {
				for _, line := range []string{"direct: blocked", "proxied: blocked", "instance: allowed"} {
					if err := mustHaveLine(res.Trace, line); err != nil {
						return err
					}
				}
				return nil
			},
		},
		{
			name: "flow", weight: 8,
			build: func(s *soakJob) fakegitlab.Job {
				job := inst.Job(base, image)
				job.Variables = append(job.Variables, masked...)
				return job
			},
			want: success,
			exact: func(s *soakJob, res fakegitlab.Result) error {
				// Whole lines, not the echo of the command that prints them. (Its egress check is
				// the egress kind's, written for a proxied pod.)
				if err := mustHaveLine(res.Trace, "tests passed: welcome, farewell"); err != nil {
					return err
				}
				if !regexp.MustCompile(`(?m)^pushed [0-9a-f]{40} on ` + regexp.QuoteMeta(duoflow.Branch(res.JobID)) + `\r?$`).MatchString(res.Trace) {
					return fmt.Errorf("the trace has no line saying it pushed %s", duoflow.Branch(res.JobID))
				}
				if len(res.Artifacts) != 1 {
					return fmt.Errorf("%d artifacts uploaded, want the session summary", len(res.Artifacts))
				}
				return nil
			},
		},
		{
			name: "disk-fill", weight: 3, abusive: true,
			build: func(s *soakJob) fakegitlab.Job {
				// Past the pod's ephemeral-storage limit (4Gi in the release's values).
				return plain(s, "dd if=/dev/zero of=fill bs=1M count=5120 status=none; echo \"dd exited $?\"", "exit 7")
			},
			want: func(*soakJob) outcome { return outcome{state: fakegitlab.StateFailed} },
		},
		{
			name: "memory-bomb", weight: 3, abusive: true,
			build: func(s *soakJob) fakegitlab.Job {
				// One 3 GiB string, past the pod's 2Gi limit: gVisor fills it in seconds, where a pipe
				// into tail kept both of the local node's CPUs busy for minutes, starving the jobs
				// starting beside it past their ready_timeout.
				return plain(s, `perl -e '$x = "x" x (3 << 30)'; echo "perl exited $?"`, "exit 9")
			},
			want: func(*soakJob) outcome { return outcome{state: fakegitlab.StateFailed} },
		},
	}
}

// plan draws the run's jobs: kinds by weight, their parameters, and when each is handed out
// (gaps with a mean of gap, and now and then a burst of 3 to 6 at once).
func plan(rng *rand.Rand, all []*kind, n int, gap time.Duration) []*soakJob {
	total := 0
	for _, k := range all {
		total += k.weight
	}
	jobs := make([]*soakJob, n)
	var at time.Duration
	burst := 0
	for i := range jobs {
		pick := rng.IntN(total)
		var k *kind
		for _, k = range all {
			if pick < k.weight {
				break
			}
			pick -= k.weight
		}
		s := &soakJob{index: i, kind: k, salt: rng.Int64N(1 << 40), exit: 1 + rng.IntN(5), lines: 200 + rng.IntN(2800),
			cancelDelay: time.Duration(500+rng.IntN(7500)) * time.Millisecond}
		switch {
		case burst > 0:
			burst--
		case rng.IntN(10) == 0:
			burst = 2 + rng.IntN(4)
			at += time.Duration(rng.ExpFloat64() * float64(gap))
		default:
			at += time.Duration(rng.ExpFloat64() * float64(gap))
		}
		s.due = at
		jobs[i] = s
	}
	return jobs
}

// numberedScript prints lines numbered 1..n, each with a checksum of its number and salt, in
// bursts with pauses, so that a stage is mid-output for a while.
func numberedScript(n int, salt int64) string {
	return fmt.Sprintf(`i=0; while [ $i -lt %d ]; do i=$((i+1)); echo "seq $i sum $(( (i * 2654435761 + %d) %% 4294967296 ))"; if [ $((i %% 400)) = 0 ]; then sleep 0.5; fi; done; echo "numbered done"`, n, salt)
}

var numberedLine = regexp.MustCompile(`(?m)^seq (\d+) sum (\d+)\r?$`)

// checkNumbered holds the trace to exactly the lines numberedScript prints: each number once, in
// order, with its checksum, and the last line.
func checkNumbered(trace string, n int, salt int64) error {
	got := numberedLine.FindAllStringSubmatch(trace, -1)
	if len(got) != n {
		return fmt.Errorf("%d numbered lines in the trace, want %d", len(got), n)
	}
	for i, m := range got {
		seq, _ := strconv.ParseInt(m[1], 10, 64)
		sum, _ := strconv.ParseInt(m[2], 10, 64)
		want := int64(i + 1)
		if seq != want || sum != (want*2654435761+salt)%4294967296 {
			return fmt.Errorf("line %d of the numbered output is %q", i+1, m[0])
		}
	}
	return mustHaveLine(trace, "numbered done")
}

// ticks are the cancel kind's lines: they must run 1, 2, 3... with nothing lost or repeated.
var tickLine = regexp.MustCompile(`(?m)^tick (\d+)\r?$`)

func checkTicks(trace string) error {
	for i, m := range tickLine.FindAllStringSubmatch(trace, -1) {
		if m[1] != strconv.Itoa(i+1) {
			return fmt.Errorf("tick %d of the output is %q", i+1, m[0])
		}
	}
	return nil
}

// mustHaveLine finds line as a whole line of the trace.
func mustHaveLine(trace, line string) error {
	for _, l := range strings.Split(trace, "\n") {
		if strings.TrimRight(l, "\r") == line {
			return nil
		}
	}
	return fmt.Errorf("the trace has no line %q", line)
}

// checkArtifact finds name in the job's one artifacts archive with the content want.
func checkArtifact(res fakegitlab.Result, name, want string) error {
	if len(res.Artifacts) != 1 {
		return fmt.Errorf("%d artifacts uploaded, want 1", len(res.Artifacts))
	}
	archive, err := zip.NewReader(bytes.NewReader(res.Artifacts[0].Data), int64(len(res.Artifacts[0].Data)))
	if err != nil {
		return fmt.Errorf("the artifacts archive: %v", err)
	}
	for _, f := range archive.File {
		if f.Name != name {
			continue
		}
		r, err := f.Open()
		if err != nil {
			return err
		}
		data, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(data) != want {
			return fmt.Errorf("%s in the artifacts is %q (%v), want %q", name, data, err, want)
		}
		return nil
	}
	return fmt.Errorf("the artifacts archive has no %s", name)
}
