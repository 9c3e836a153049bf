package localcluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The "GitLab instance" of the local cluster (tests/cluster/networkpolicy.sh): a network
// namespace on the instance network, which deploy/local's SandboxTemplate lets job pods reach
// on TCP 80 and 443 only. This machine reaches it through its veth peer.
const (
	InstanceNetns   = "sbx-gitlab"
	instanceLink    = "eth0"
	instancePrefix  = "10.99.1."
	instanceHTTP    = "80"
	firstInstanceIP = 10 // .1 is this machine's side, .2 networkpolicy.sh's own server
	lastInstanceIP  = 250
)

// OutsideURL is "the internet" of the local cluster: reachable from this machine, and by job
// pods only where no policy limits their egress (networkpolicy.sh's server in sbx-outside).
const OutsideURL = "http://10.99.0.2/"

// ListenOnInstanceNetwork listens on TCP port 80 of an address of its own in the instance
// network, inside the instance's network namespace, so that job pods (allowed there by their
// NetworkPolicy) and this machine (the runner) both reach the server. Several tests may do this
// at once: each takes a free address, which Close removes again. Addresses left behind by a
// process that died are removed first.
func ListenOnInstanceNetwork() (net.Listener, error) {
	return ListenOnInstanceNetworkPort(instanceHTTP)
}

// ListenOnInstanceNetworkPort is ListenOnInstanceNetwork on another port: 443 for an instance
// served over HTTPS (the instance network's policy admits TCP 80 and 443).
func ListenOnInstanceNetworkPort(port string) (net.Listener, error) {
	nsPath := "/run/netns/" + InstanceNetns
	if _, err := os.Stat(nsPath); err != nil {
		return nil, fmt.Errorf("network namespace %s missing: run tests/cluster/networkpolicy.sh up (make cluster-up)", InstanceNetns)
	}
	removeOrphanAddresses()
	start := firstInstanceIP + rand.IntN(lastInstanceIP-firstInstanceIP+1)
	for i := 0; i <= lastInstanceIP-firstInstanceIP; i++ {
		ip := instancePrefix + fmt.Sprint(firstInstanceIP+(start-firstInstanceIP+i)%(lastInstanceIP-firstInstanceIP+1))
		if !claimAddress(ip) {
			continue
		}
		listener, err := listenInNetns(nsPath, net.JoinHostPort(ip, port))
		if err != nil {
			releaseAddress(ip)
			if errors.Is(err, unix.EADDRINUSE) {
				continue
			}
			return nil, err
		}
		return &instanceListener{Listener: listener, ip: ip}, nil
	}
	return nil, fmt.Errorf("no free address in %s0/24 in network namespace %s", instancePrefix, InstanceNetns)
}

// ownerLabel labels an address with the process that claimed it ("eth0:p<pid>", at most 15
// bytes), so a later claimer can tell an orphan from an address in use.
var ownerLabel = regexp.MustCompile(`inet (` + regexp.QuoteMeta(instancePrefix) + `\d+)/32 .*\b` + instanceLink + `:p(\d+)\b`)

// claimAddress adds ip to the instance's interface unless some address record already has it;
// the kernel refuses a second identical record, so two claimers cannot both win.
func claimAddress(ip string) bool {
	out, err := exec.Command("ip", "-n", InstanceNetns, "-o", "-4", "addr", "show").Output()
	if err != nil || strings.Contains(string(out), " "+ip+"/") {
		return false
	}
	label := fmt.Sprintf("%s:p%d", instanceLink, os.Getpid())
	return exec.Command("ip", "-n", InstanceNetns, "addr", "add", ip+"/32", "dev", instanceLink, "label", label).Run() == nil
}

// removeOrphanAddresses removes addresses whose claiming process no longer exists.
func removeOrphanAddresses() {
	out, err := exec.Command("ip", "-n", InstanceNetns, "-o", "-4", "addr", "show", "dev", instanceLink).Output()
	if err != nil {
		return
	}
	for _, m := range ownerLabel.FindAllStringSubmatch(string(out), -1) {
		if pid, err := strconv.Atoi(m[2]); err == nil && errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
			releaseAddress(m[1])
		}
	}
}

func releaseAddress(ip string) {
	_ = exec.Command("ip", "-n", InstanceNetns, "addr", "del", ip+"/32", "dev", instanceLink).Run()
}

// listenInNetns creates the listening socket from a thread that joined the namespace: the
// socket stays in that namespace whichever thread then accepts on it.
func listenInNetns(nsPath, address string) (net.Listener, error) {
	type result struct {
		listener net.Listener
		err      error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine instead of going back to the
		// scheduler in the wrong namespace.
		runtime.LockOSThread()
		ns, err := os.Open(nsPath)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- result{err: fmt.Errorf("joining network namespace %s: %w", nsPath, err)}
			return
		}
		listener, err := net.Listen("tcp", address)
		done <- result{listener, err}
	}()
	r := <-done
	return r.listener, r.err
}

type instanceListener struct {
	net.Listener
	ip   string
	once sync.Once
}

func (l *instanceListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { releaseAddress(l.ip) })
	return err
}
