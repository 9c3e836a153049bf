// Command scale measures SandboxClaim latency at scale against the real kube-apiserver, etcd,
// scheduler and agent-sandbox controller of the local cluster, with kwok playing the nodes
// (tools/scale/kwok.sh up). Run it through `make bench-scale`.
//
// Each round fires N claims at once, each through the executor's own claim path
// (kube.Claimer.Claim: create, a watch on that one claim, then Resolve's two GETs and its
// fail-closed pod check), each on its own API server connection as N separate `prepare`
// processes would be. A separate single watch on all claims of the namespace records when each
// claim turned Ready as the API server published it: that is the control plane's latency, the
// Claim() figure adds the client's share. Nothing is polled while measuring.
//
// Warm rounds pre-fill the pool with N sandboxes and wait until it is Ready; the pool refills
// while the claims are adopting (as in production), so refill traffic races the burst. Cold
// rounds use a pool of 0: every claim creates its Sandbox and pod, which the real scheduler
// binds to a kwok node and kwok marks Running.
//
// The agent-sandbox controller is the cluster's own, in-cluster Deployment. With -controller-flags
// the rounds run once per setting: the Deployment's args are changed, the bench waits for the
// rollout and the new pod's leadership, and the original args are always put back (and waited for)
// before it exits; they are recorded on the Deployment meanwhile, so a run killed before restoring
// is undone by the next.
//
// The pods carry runtimeClassName gvisor like production pods (the RuntimeClass has no
// scheduling constraint, and kwok never runs them), so the executor's check passes unchanged.
// Everything lives in its own namespace, created at start and deleted (and waited for) at the end.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// What kwok.sh puts on its fake nodes.
const (
	kwokNodeLabel = "sandbox-executor.local/kwok"
	kwokTaintKey  = "kwok.x-k8s.io/node"
)

const (
	poolName   = "scale"
	runnerName = "scale-bench"
	// ownerLabel marks the namespace as this tool's, so a leftover from an aborted run may be
	// deleted and nothing else ever is.
	ownerLabel = "sandbox-executor.local/scale-bench"
)

type options struct {
	kubeconfig   string
	namespace    string
	out          string
	warm, cold   []int
	qps          float64
	burst        int
	roundTimeout time.Duration
	clusterDir   string
	// controller is the agent-sandbox controller's Deployment, namespace/name.
	controller string
	// settings are the controller flags to run the rounds with, one entry per setting; nil runs
	// them once with the controller as found.
	settings [][]string
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func parseFlags() (*options, error) {
	dir, err := localcluster.ClusterDir()
	if err != nil {
		return nil, err
	}
	o := &options{clusterDir: dir}
	var warm, cold string
	flag.StringVar(&o.kubeconfig, "kubeconfig", filepath.Join(dir, "kubeconfig", "admin.kubeconfig"), "admin kubeconfig of the cluster")
	flag.StringVar(&o.namespace, "namespace", "sandbox-scale", "namespace to create, use and delete")
	flag.StringVar(&o.out, "out", "", "also write the markdown tables to this file")
	flag.StringVar(&warm, "warm", "100,500,1000", "comma-separated claim counts for warm rounds (pool pre-filled to N)")
	flag.StringVar(&cold, "cold", "100", "comma-separated claim counts for cold rounds (pool of 0); empty for none")
	flag.Float64Var(&o.qps, "qps", 10000, "client QPS per claimer connection (high: the client must not be the limit)")
	flag.IntVar(&o.burst, "burst", 10000, "client burst per claimer connection")
	flag.DurationVar(&o.roundTimeout, "round-timeout", 15*time.Minute, "limit for each phase of a round (pool fill, claims, cleanup)")
	flag.StringVar(&o.controller, "controller", "agent-sandbox-system/agent-sandbox-controller", "the agent-sandbox controller's Deployment, namespace/name")
	flag.Func("controller-flags", "run the rounds with these controller flags (--name=value ..., replacing the same flags of its args; '' for the args as found); repeat for several settings, each rolled out in turn, the original args restored at the end", func(v string) error {
		args, err := parseSetting(v)
		o.settings = append(o.settings, args)
		return err
	})
	flag.Parse()
	if flag.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(flag.Args(), " "))
	}
	if o.warm, err = parseCounts("warm", warm); err != nil {
		return nil, err
	}
	if o.cold, err = parseCounts("cold", cold); err != nil {
		return nil, err
	}
	if _, _, err := parseDeployment(o.controller); err != nil {
		return nil, err
	}
	if len(o.warm)+len(o.cold) == 0 {
		return nil, errors.New("nothing to do: -warm and -cold are both empty")
	}
	return o, nil
}

func parseCounts(name, s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 5000 {
			return nil, fmt.Errorf("-%s: %q is not a claim count between 1 and 5000", name, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s scale: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
