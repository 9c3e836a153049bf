package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Where the time goes during a burst: CPU of each cluster process and the limiters' own metrics.

// components are the cluster's daemons by PID file name (tests/cluster/lib.sh start_daemon).
var components = []string{"kube-apiserver", "etcd", "agent-sandbox", "kube-scheduler", "kube-controller-manager", "kwok", "kube-router", "kubelet"}

type snapshot struct {
	cpu        map[string]float64 // CPU seconds per component
	apiserver  map[string]float64 // selected series of the apiserver's /metrics
	controller map[string]float64 // selected series of the controller's /metrics
}

func (b *bench) snapshot(ctx context.Context) snapshot {
	s := snapshot{cpu: map[string]float64{}}
	if busy, err := machineBusySeconds(); err == nil {
		s.cpu[machine] = busy
	}
	for _, c := range append(slices.Clone(components), "bench") {
		pid := "self"
		if c != "bench" {
			var err error
			if pid, err = daemonPID(b.o.clusterDir, c); err != nil {
				continue
			}
		}
		if sec, err := cpuSeconds(pid); err == nil {
			s.cpu[c] = sec
		}
	}
	if raw, err := b.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx); err == nil {
		s.apiserver = parseMetrics(bytes.NewReader(raw), "apiserver_flowcontrol_request_wait_duration_seconds_", "apiserver_flowcontrol_rejected_requests_total", "apiserver_request_total{",
			"apiserver_request_duration_seconds_sum{", "apiserver_request_duration_seconds_count{")
	}
	if resp, err := http.Get(b.o.controller); err == nil {
		s.controller = parseMetrics(resp.Body, "workqueue_queue_duration_seconds_", "workqueue_work_duration_seconds_")
		resp.Body.Close()
	}
	return s
}

func daemonPID(clusterDir, name string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(clusterDir, "run", name+".pid"))
	return strings.TrimSpace(string(raw)), err
}

// daemonArgs is a cluster daemon's command line without the program and the flags naming local
// paths, or "unknown".
func daemonArgs(clusterDir, name string) string {
	pid, err := daemonPID(clusterDir, name)
	if err != nil {
		return "unknown"
	}
	raw, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil {
		return "unknown"
	}
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")[1:]
	args = slices.DeleteFunc(args, func(a string) bool { return strings.Contains(a, "/") })
	return strings.Join(args, " ")
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

func (r *result) diff(before, after snapshot) {
	r.cpu = map[string]float64{}
	for c, v := range after.cpu {
		// A negative delta: the daemon was restarted during the burst (its PID file moved on).
		if b, ok := before.cpu[c]; ok && v >= b {
			r.cpu[c] = v - b
		}
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
	// The controller authenticates as a user outside any system group: API priority and
	// fairness puts it in the global-default priority level.
	const pl = `priority_level="global-default"`
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
