package netfence

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// ErrWitnessArrived is ProbeWitness's answer when no table stopped the datagram.
var ErrWitnessArrived = errors.New("a datagram to the witness arrived")

// ProbeWitness proves the netstack fence's table is in place: it binds a UDP socket of its own on
// Witness and sends it a datagram from 127.0.0.1, which the table's first rule refuses. Loopback
// traffic never leaves the sandbox and the socket is there to receive it, so only a filter on
// the sandbox's own stack can stop it. It returns nil when one did: the send was refused
// (ECONNREFUSED: gVisor's icmp-port-unreachable, delivered at once; EPERM: Linux's answer to a
// send its netfilter drops or rejects) or nothing happened within timeout (a table without
// REJECT drops it); ErrWitnessArrived (wrapped, with the witness's address) when the datagram
// arrived: no table; another error when the probe could not be made.
func ProbeWitness(timeout time.Duration) error {
	l, err := net.ListenPacket("udp4", net.JoinHostPort(Witness.String(), "0"))
	if err != nil {
		return err
	}
	defer l.Close()
	d := net.Dialer{LocalAddr: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}}
	c, err := d.Dial("udp4", l.LocalAddr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	_ = l.SetDeadline(deadline)
	_ = c.SetDeadline(deadline)
	token := fmt.Appendf(nil, "sandbox-executor fence witness %s", c.LocalAddr())
	stopped := func(err error) bool {
		return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPERM)
	}
	if _, err := c.Write(token); stopped(err) {
		return nil
	} else if err != nil {
		return err
	}
	// Whichever comes first: the datagram at the witness, or the refusal at the sender.
	arrived, refused := make(chan error, 1), make(chan error, 1)
	go func() {
		buf := make([]byte, len(token)+1)
		for {
			n, from, err := l.ReadFrom(buf)
			if err != nil || (from.String() == c.LocalAddr().String() && string(buf[:n]) == string(token)) {
				arrived <- err
				return
			}
		}
	}()
	go func() {
		_, err := c.Read(make([]byte, 1))
		refused <- err
	}()
	var ne net.Error
	for range 2 {
		select {
		case err := <-arrived:
			if err == nil {
				return fmt.Errorf("%w (%s)", ErrWitnessArrived, l.LocalAddr())
			}
			if !errors.As(err, &ne) || !ne.Timeout() {
				return err
			}
		case err := <-refused:
			switch {
			case stopped(err):
				return nil
			case err == nil:
				return errors.New("the witness's sender got an answer")
			case !errors.As(err, &ne) || !ne.Timeout():
				return err
			}
		}
	}
	return nil
}
