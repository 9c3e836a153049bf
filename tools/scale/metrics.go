package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Where the time goes during a burst: CPU of each cluster process and the limiters' own metrics.

// components are the cluster's processes: its daemons on this node by PID file name
// (tests/cluster/lib.sh start_daemon), and the agent-sandbox controller, whose pod runs here.
var components = []string{"kube-apiserver", "etcd", controllerComponent, "kube-scheduler", "kube-controller-manager", "kwok", "kube-router", "kubelet"}

// controllerComponent is the agent-sandbox controller's column: the process of its container.
const controllerComponent = "agent-sandbox"

type snapshot struct {
	cpu map[string]float64 // CPU seconds per component
	// pid is the process each figure of cpu was read from: a figure is compared only with one of
	// the same process (a restarted daemon or controller starts again from zero).
	pid        map[string]string
	apiserver  map[string]float64 // selected series of the apiserver's /metrics
	controller map[string]float64 // selected series of the controller's /metrics
	// controllerContainer is the controller's container (its ID: a restart makes a new one)
	// that controller was scraped from, "" if not scraped; restarts is its pod's restart count.
	controllerContainer string
	restarts            int32
}

func (b *bench) snapshot(ctx context.Context) snapshot {
	s := snapshot{cpu: map[string]float64{}, pid: map[string]string{}}
	if busy, err := machineBusySeconds(); err == nil {
		s.cpu[machine] = busy
	}
	pod, err := b.ctrl.Pod(ctx)
	if err != nil {
		logf("no controller figures in this snapshot: %v", err)
	}
	for _, c := range append(slices.Clone(components), "bench") {
		var pid string
		switch {
		case c == "bench":
			pid = strconv.Itoa(os.Getpid())
		case c == controllerComponent:
			if pod == nil {
				continue
			}
			if pid, err = b.ctrl.containerPID(pod); err != nil {
				logf("no controller CPU in this snapshot: %v", err)
				continue
			}
		default:
			if pid, err = daemonPID(b.o.clusterDir, c); err != nil {
				continue
			}
		}
		if sec, err := cpuSeconds(pid); err == nil {
			s.cpu[c], s.pid[c] = sec, pid
		}
	}
	if raw, err := b.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx); err == nil {
		s.apiserver = parseMetrics(bytes.NewReader(raw), "apiserver_flowcontrol_request_wait_duration_seconds_", "apiserver_flowcontrol_rejected_requests_total", "apiserver_request_total{",
			"apiserver_request_duration_seconds_sum{", "apiserver_request_duration_seconds_count{")
	}
	if pod != nil {
		if raw, err := b.ctrl.metrics(ctx, pod); err == nil {
			s.controller = parseMetrics(bytes.NewReader(raw), "workqueue_queue_duration_seconds_", "workqueue_work_duration_seconds_", "controller_runtime_max_concurrent_reconciles{")
			s.controllerContainer, s.restarts = b.ctrl.containerState(pod)
		} else {
			logf("no controller metrics in this snapshot: %v", err)
		}
	}
	return s
}

func daemonPID(clusterDir, name string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(clusterDir, "run", name+".pid"))
	return strings.TrimSpace(string(raw)), err
}

// machine is the snapshot key of the whole machine's busy CPU time.
const machine = "machine"

// machineBusySeconds is the CPU time all cores spent not idle, from /proc/stat.
func machineBusySeconds() (float64, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, errors.New("unexpected /proc/stat")
	}
	var busy float64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, err
		}
		busy += n
	}
	return busy / 100, nil
}

// cpuSeconds reads utime+stime of a process (and its waited-for children) from /proc.
func cpuSeconds(pid string) (float64, error) {
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the ")" that ends the command name: state is field 3, utime 14, stime 15.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	var ticks float64
	for _, s := range f[11:13] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	// USER_HZ is 100 on every Linux architecture Go supports here.
	return ticks / 100, nil
}

// parseMetrics keeps the Prometheus text series whose names start with one of the prefixes.
func parseMetrics(r io.Reader, prefixes ...string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(line, p) }) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] += v
		}
	}
	return out
}

// sumDelta sums after-before over the series whose name starts with prefix and that carry all
// the label fragments.
func sumDelta(before, after map[string]float64, prefix string, labels ...string) float64 {
	var d float64
	for k, v := range after {
		if strings.HasPrefix(k, prefix) && !slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(k, l) }) {
			d += v - before[k]
		}
	}
	return d
}

func (r *result) diff(before, after snapshot, priorityLevel string) {
	r.cpu = map[string]float64{}
	for c, v := range after.cpu {
		if b, ok := before.cpu[c]; ok && before.pid[c] == after.pid[c] {
			r.cpu[c] = v - b
		}
	}
	// Its workers are its args', whichever container reports them.
	r.workers = workers(after.controller)
	// A controller restarted during the burst starts its counters again: no figures then.
	if before.controllerContainer != after.controllerContainer {
		before.controller, after.controller = nil, nil
		r.controllerRestarted = true
	}
	var durSum, durCount float64
	for k, v := range after.apiserver {
		if !strings.Contains(label(k, "group"), "agents.x-k8s.io") || slices.Contains([]string{"WATCH", "CONNECT"}, label(k, "verb")) {
			continue
		}
		switch {
		case strings.HasPrefix(k, "apiserver_request_duration_seconds_sum{"):
			durSum += v - before.apiserver[k]
		case strings.HasPrefix(k, "apiserver_request_duration_seconds_count{"):
			durCount += v - before.apiserver[k]
		}
	}
	r.serverMean = mean(durSum, durCount)
	r.writes = map[string]float64{}
	for k, v := range after.apiserver {
		if !strings.HasPrefix(k, "apiserver_request_total{") || !slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE"}, label(k, "verb")) {
			continue
		}
		res := label(k, "resource")
		if sub := label(k, "subresource"); sub != "" {
			res += "/" + sub
		}
		r.writes[res] += v - before.apiserver[k]
	}
	pl := `priority_level="` + priorityLevel + `"`
	r.apfWait = sumDelta(before.apiserver, after.apiserver, "apiserver_flowcontrol_request_wait_duration_seconds_sum", pl)
	r.apfDispatched = sumDelta(before.apiserver, after.apiserver, "apiserver_flowcontrol_request_wait_duration_seconds_count", pl)
	r.apfReject = sumDelta(before.apiserver, after.apiserver, "apiserver_flowcontrol_rejected_requests_total", pl)
	r.queueWait, r.work = map[string]float64{}, map[string]float64{}
	for _, c := range []string{"sandboxclaim", "sandbox", "sandboxwarmpool"} {
		l := `name="` + c + `"`
		r.queueWait[c] = mean(sumDelta(before.controller, after.controller, "workqueue_queue_duration_seconds_sum", l),
			sumDelta(before.controller, after.controller, "workqueue_queue_duration_seconds_count", l))
		r.work[c] = mean(sumDelta(before.controller, after.controller, "workqueue_work_duration_seconds_sum", l),
			sumDelta(before.controller, after.controller, "workqueue_work_duration_seconds_count", l))
	}
}

// label is the value of one label of a Prometheus series, or "".
func label(series, name string) string {
	for _, sep := range []string{"{", ","} {
		if _, rest, ok := strings.Cut(series, sep+name+`="`); ok {
			v, _, _ := strings.Cut(rest, `"`)
			return v
		}
	}
	return ""
}

func mean(sum, count float64) float64 {
	if count == 0 {
		return 0
	}
	return sum / count
}
