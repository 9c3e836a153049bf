package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/netfence"
	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// Fence is the pod's egress fence as its template describes it (wire.FenceDenyEnv and friends).
type Fence struct {
	Deny, Allow []string
	Timeout     time.Duration
	// Netstack: the pod's netstack fence must be in place (wire.FenceNetstackEnv), and the check
	// proves it through the table's witness.
	Netstack bool
	// invalid is what is wrong with the configuration: a fence that cannot be checked does not
	// hold.
	invalid string
}

// FenceFromEnv reads the fence from the environment the template gives the job container.
func FenceFromEnv(getenv func(string) string) Fence {
	f := Fence{Timeout: wire.FenceTimeout}
	var problems []string
	f.Deny, problems = addresses(wire.FenceDenyEnv, getenv(wire.FenceDenyEnv), problems)
	f.Allow, problems = addresses(wire.FenceAllowEnv, getenv(wire.FenceAllowEnv), problems)
	if v := getenv(wire.FenceTimeoutEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Millisecond || d > 5*time.Second {
			problems = append(problems, fmt.Sprintf("%s=%q is not a duration from 10ms to 5s", wire.FenceTimeoutEnv, v))
		} else {
			f.Timeout = d
		}
	}
	switch v := getenv(wire.FenceNetstackEnv); v {
	case "", "false":
	case "true":
		f.Netstack = true
	default:
		problems = append(problems, fmt.Sprintf("%s=%q is neither true nor false", wire.FenceNetstackEnv, v))
	}
	f.invalid = strings.Join(problems, "; ")
	return f
}

func addresses(name, list string, problems []string) ([]string, []string) {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			problems = append(problems, fmt.Sprintf("%s: %q is not host:port", name, a))
			continue
		}
		out = append(out, a)
	}
	return out, problems
}

// Configured reports whether the pod names any address to check.
// Netstack alone is not: it adds the witness to the check of the addresses.
func (f Fence) Configured() bool { return len(f.Deny) > 0 || len(f.Allow) > 0 || f.invalid != "" }

// Check connects to every address at once and reports whether the fence holds now: no denied
// address connects (a refusal, an unreachable network or no answer within Timeout all count as
// denied: a REJECT-ing and a DROP-ing policy look like that) and every allowed one does. It
// costs one TCP connect per address, closed at once, and at most Timeout.
//
// A denied canary's refusal proves a fence only because the canary accepts whenever it is not
// fenced off (wire.FenceDenyEnv), as its silence does. With Netstack, the check also proves the
// netstack fence's table is in place: it sends a datagram to a socket of its own on the table's
// witness address (netfence.ProbeWitness), which only that table can stop, and the check fails
// if it arrives. That table refuses all TCP it does not accept with a reset, at once: the
// refusal a denied canary then meets is the table's.
func (f Fence) Check() wire.FenceReport {
	if !f.Configured() {
		return wire.FenceReport{}
	}
	if f.invalid != "" {
		return wire.FenceReport{Configured: true, Problems: []string{f.invalid}}
	}
	// problems[0] is the netstack fence's witness, then one per address.
	problems := make([]string, 1+len(f.Deny)+len(f.Allow))
	var wg sync.WaitGroup
	if f.Netstack {
		wg.Go(func() { problems[0] = f.witness() })
	}
	dialer := net.Dialer{Timeout: f.Timeout}
	for i, addr := range append(append([]string{}, f.Deny...), f.Allow...) {
		denied := i < len(f.Deny)
		wg.Go(func() {
			conn, err := dialer.Dial("tcp", addr)
			switch {
			case err == nil:
				conn.Close()
				if denied {
					problems[1+i] = "denied canary " + addr + " is reachable"
				}
			case !denied:
				problems[1+i] = "allowed " + addr + " is not reachable (" + dialFailure(err, f.Timeout) + ")"
			}
		})
	}
	wg.Wait()
	report := wire.FenceReport{Configured: true}
	for _, p := range problems {
		if p != "" {
			report.Problems = append(report.Problems, p)
		}
	}
	report.Holds = len(report.Problems) == 0
	return report
}

// witness proves the netstack fence's table is in place (netfence.ProbeWitness) and returns
// what does not hold, or "".
func (f Fence) witness() string {
	err := netfence.ProbeWitness(f.Timeout)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, netfence.ErrWitnessArrived):
		return "the netstack fence is not in place: " + err.Error()
	}
	return "cannot check the netstack fence: " + err.Error()
}

// dialFailure says briefly why a connect failed.
func dialFailure(err error, timeout time.Duration) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "no answer within " + timeout.String()
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}

// fenceCommand is "fence": a fresh check, printed as a wire.FenceReport.
func fenceCommand(stdout io.Writer) error {
	return json.NewEncoder(stdout).Encode(FenceFromEnv(os.Getenv).Check())
}

// fenceReuse is how long one check answers further probes: the kubelet probes every few
// seconds, and anyone else who may reach the port (the runners) cannot make the pod connect
// more often than this.
const fenceReuse = time.Second

// ServeFence answers readiness probes on ln: "200 OK" while the fence holds, "503 Service
// Unavailable" with the problems otherwise, to any request. Each answer comes from a fresh check
// (at most one per fenceReuse), so the kubelet's probe period is the check's period: no timer
// runs in the pod between probes. It is HTTP by hand, as the network path is TCP by hand: net/http
// would add megabytes to the agent.
func ServeFence(ln net.Listener, f Fence) error {
	c := &fenceChecker{fence: f}
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go c.answer(conn)
	}
}

type fenceChecker struct {
	fence  Fence
	mu     sync.Mutex
	last   wire.FenceReport
	lastAt time.Time
}

// check runs a check, or returns one younger than fenceReuse; concurrent probes share one.
func (c *fenceChecker) check() wire.FenceReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastAt.IsZero() || time.Since(c.lastAt) >= fenceReuse {
		c.last, c.lastAt = c.fence.Check(), time.Now()
	}
	return c.last
}

func (c *fenceChecker) answer(conn net.Conn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	// The request's head is read to its end and not looked at: every path answers the fence.
	r := bufio.NewReader(io.LimitReader(conn, 8<<10))
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if line == "\r\n" || line == "\n" {
			break
		}
	}
	report := c.check()
	status := "200 OK"
	if !report.Holds {
		status = "503 Service Unavailable"
	}
	body := report.String() + "\n"
	_, _ = io.WriteString(conn, "HTTP/1.1 "+status+"\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
}
