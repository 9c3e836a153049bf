// Package packetcapture records, with tcpdump, which sources sent packets to an address across a
// link: the suites' proof of what reached "the internet" of the local cluster.
package packetcapture

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Log is what tcpdump saw reach an address: each packet's source and time.
type Log struct {
	dst     string
	mu      sync.Mutex
	packets []packet
}

type packet struct {
	at  time.Time
	src string
}

// FencedAgain waits until src has sent nothing for quiet (the canary tries every 100 ms: that many
// attempts in a row were dropped), and returns when its last packet passed, or since.
func (c *Log) FencedAgain(t testing.TB, src string, since time.Time, quiet time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		last := since
		c.mu.Lock()
		for _, p := range c.packets {
			if p.src == src && p.at.After(last) {
				last = p.at
			}
		}
		c.mu.Unlock()
		if time.Since(last) >= quiet {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still reaches %s a minute after NetworkPolicy came back up", src, c.dst)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// From counts the packets of src seen from begin to end (a zero begin: from the start).
func (c *Log) From(src string, begin, end time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, p := range c.packets {
		if p.src == src && !p.at.Before(begin) && !p.at.After(end) {
			n++
		}
	}
	return n
}

// To records every IPv4 packet sent to dst across link until the test ends.
func To(t testing.TB, link, dst string) *Log {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "tcpdump", "-i", link, "-n", "-l", "-tt", "-q", "ip and dst host "+dst)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	c := &Log{dst: dst}
	listening := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			// "1764000000.123456 IP 10.88.0.5.43210 > 10.99.0.2.80: tcp 0"
			f := strings.Fields(scanner.Text())
			if len(f) < 3 || f[1] != "IP" {
				continue
			}
			sec, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				continue
			}
			src := f[2][:strings.LastIndexByte(f[2], '.')]
			c.mu.Lock()
			c.packets = append(c.packets, packet{at: time.Unix(0, int64(sec*1e9)), src: src})
			c.mu.Unlock()
		}
	}()
	// tcpdump says "listening on" (on stderr) once it captures.
	go func() {
		scanner := bufio.NewScanner(stderr)
		for scanner.Scan() {
			if strings.Contains(scanner.Text(), "listening on") {
				close(listening)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("tcpdump on %s did not start within 10 s", link)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		<-done
	})
	return c
}

// Sources counts the packets seen from each source from begin to end.
func (c *Log) Sources(begin, end time.Time) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := map[string]int{}
	for _, p := range c.packets {
		if !p.at.Before(begin) && !p.at.After(end) {
			n[p.src]++
		}
	}
	return n
}
