package tlsinit_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/operator/tlsinit"
)

// tls init makes a CA the executor loads, keeps its key private, and never overwrites one.
func TestInitMakesALoadableCAOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "agent-ca")
	var out bytes.Buffer
	if err := tlsinit.Run(&out, tlsinit.Options{Dir: dir, Validity: 48 * time.Hour, Name: "test"}); err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	ca, err := agentca.Load(cert, key)
	if err != nil {
		t.Fatalf("the CA written does not load: %v", err)
	}
	if left := time.Until(ca.NotAfter()); left < 47*time.Hour || left > 49*time.Hour {
		t.Errorf("the CA expires in %s, want --validity 48h", left)
	}
	if info, err := os.Stat(key); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("the key's mode: %v, %v; want 0600", info.Mode(), err)
	}
	if !strings.Contains(out.String(), "create configmap sandbox-executor-agent-ca") {
		t.Errorf("no install steps printed:\n%s", out.String())
	}
	before, _ := os.ReadFile(key)
	err = tlsinit.Run(&out, tlsinit.Options{Dir: dir, Validity: 48 * time.Hour})
	if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a second init: %v; want a permanent error saying the CA exists", err)
	}
	if after, _ := os.ReadFile(key); !bytes.Equal(before, after) {
		t.Error("a second init changed the key")
	}
	if err := tlsinit.Run(&out, tlsinit.Options{Dir: t.TempDir(), Validity: time.Hour}); failure.KindOf(err) != failure.KindPermanent {
		t.Errorf("a CA valid for an hour: %v; want refused", err)
	}
}
