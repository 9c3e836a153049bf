package stagehost

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Stages share one connection per cluster; a kubeconfig rewritten since (new credentials, another
// server) is a new cluster.
func TestSharedClientsReconnectWhenTheKubeconfigChanges(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	connects := 0
	shared := &sharedClients{background: context.Background(), connect: func(*config.Config) (*kube.Clients, error) {
		connects++
		return &kube.Clients{}, nil
	}}
	defer shared.wait()
	cfg := &config.Config{Kubeconfig: kubeconfig, Namespace: "ns", StageTransport: config.TransportExec}
	first, _ := shared.get(cfg)
	if again, _ := shared.get(cfg); again != first || connects != 1 {
		t.Fatalf("the same cluster connected %d times", connects)
	}
	if err := os.WriteFile(kubeconfig, []byte("second credentials"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(kubeconfig, later, later); err != nil {
		t.Fatal(err)
	}
	if changed, _ := shared.get(cfg); changed == first || connects != 2 {
		t.Errorf("a rewritten kubeconfig kept the old connection (%d connects)", connects)
	}
	if len(shared.byKey) != 1 {
		t.Errorf("%d connections kept, want only the current kubeconfig's", len(shared.byKey))
	}
}
