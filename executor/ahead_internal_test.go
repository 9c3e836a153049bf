package executor

import (
	"crypto/tls"
	"net"
	"testing"
	"time"
)

// take hands over only a connection to the address and identity the verified pod shows, and
// closes any other.
func TestTakeMatchesAddressAndIdentity(t *testing.T) {
	for _, tc := range []struct {
		name, addr, identity string
		want                 bool
	}{
		{"the same pod", "10.0.0.5:7543", "sha256:aa", true},
		{"another address", "10.0.0.6:7543", "sha256:aa", false},
		{"another identity", "10.0.0.5:7543", "sha256:bb", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer server.Close()
			d := &AgentDial{addr: "10.0.0.5:7543", identity: "sha256:aa", done: make(chan struct{}), cancel: func() {}, conn: tls.Client(client, &tls.Config{}), at: time.Now()}
			close(d.done)
			got, _, _ := d.take(tc.addr, tc.identity)
			if (got != nil) != tc.want {
				t.Fatalf("take(%s, %s) = %v, want a connection: %v", tc.addr, tc.identity, got, tc.want)
			}
			if got == nil {
				// The dropped connection is closed: its peer reads EOF.
				if _, err := server.Read(make([]byte, 1)); err == nil {
					t.Error("the connection not taken is still open")
				}
			} else {
				got.Close()
			}
			if again, _, _ := d.take("10.0.0.5:7543", "sha256:aa"); again != nil {
				t.Error("a second take got the connection again")
			}
			d.Close()
		})
	}
}
