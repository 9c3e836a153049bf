// Package faultproxy is a TCP proxy on loopback that can cut every connection through it on
// demand: a stand-in for load balancers dropping idle streams, API server rotations and network
// blips between the executor and the Kubernetes API.
package faultproxy

import (
	"io"
	"net"
	"sync"
)

// Proxy forwards connections from a loopback port to an upstream address.
type Proxy struct {
	listener net.Listener
	upstream string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	cuts  int
	wg    sync.WaitGroup
}

// Start listens on 127.0.0.1 on a free port and forwards to upstream (host:port).
func Start(upstream string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{listener: l, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.listener.Addr().String() }

// Cut closes every open connection, both sides, and returns how many sockets it closed.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
	p.cuts++
	return n
}

// Cuts is how often Cut was called.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Close stops the proxy and closes all connections.
func (p *Proxy) Close() {
	p.listener.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client] = struct{}{}
		p.conns[server] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	// An error or EOF on either side ends both directions, like a middlebox dropping the flow.
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
