package faultproxy_test

import (
	"bufio"
	"net"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/faultproxy"
)

func TestProxyForwardsAndCuts(t *testing.T) {
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.Close()
	go func() {
		for {
			c, err := upstream.Accept()
			if err != nil {
				return
			}
			go func() { // echo lines
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						c.Close()
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	p, err := faultproxy.Start(upstream.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	c.Write([]byte("ping\n"))
	if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo through proxy = %q, %v", line, err)
	}
	p.Cut()
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("connection survived Cut")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Write([]byte("again\n"))
	if line, err := bufio.NewReader(c2).ReadString('\n'); err != nil || line != "again\n" {
		t.Fatalf("new connection after a cut = %q, %v", line, err)
	}
	if p.Cuts() != 1 {
		t.Errorf("Cuts = %d", p.Cuts())
	}
}
