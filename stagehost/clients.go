package stagehost

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// sharedClients connects once per cluster and namespace (kubeconfig, context, namespace) and
// hands every stage the same clients: one HTTP/2 connection to the API server, kept warm between
// jobs, and with the network transport the identity lines of the namespace's pods, read ahead. A
// kubeconfig that changes (new credentials, another server) is a new cluster.
type sharedClients struct {
	connect Connect
	// background is the server's life: the identity lines are followed until it ends.
	background context.Context
	running    sync.WaitGroup
	mu         sync.Mutex
	byKey      map[clientsKey]*sharedCluster
}

type clientsKey struct {
	kubeconfig, context, namespace string
	modified                       time.Time
	size                           int64
}

type sharedCluster struct {
	clients *kube.Clients
	stop    context.CancelFunc
}

func (s *sharedClients) get(cfg *config.Config) (*kube.Clients, error) {
	key := clientsKey{kubeconfig: cfg.Kubeconfig, context: cfg.Context, namespace: cfg.Namespace}
	if info, err := os.Stat(cfg.Kubeconfig); cfg.Kubeconfig != "" && err == nil {
		key.modified, key.size = info.ModTime(), info.Size()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.byKey[key]; ok {
		return c.clients, nil
	}
	connected, err := s.connect(cfg)
	if err != nil {
		return nil, err
	}
	if s.byKey == nil {
		s.byKey = map[clientsKey]*sharedCluster{}
	}
	for old, c := range s.byKey {
		if old.kubeconfig == key.kubeconfig && old.context == key.context && old.namespace == key.namespace {
			c.stop() // the kubeconfig changed since
			delete(s.byKey, old)
		}
	}
	clients := *connected
	ctx, stop := context.WithCancel(s.background)
	if cfg.StageTransport == config.TransportNetwork {
		clients.AgentLines = kube.NewAgentLines(&clients, cfg.Namespace)
		s.running.Add(1)
		go func() {
			defer s.running.Done()
			clients.AgentLines.Run(ctx)
		}()
	}
	s.byKey[key] = &sharedCluster{clients: &clients, stop: stop}
	return &clients, nil
}

// wait stops what the shared clients follow and waits for it, once the server has stopped.
func (s *sharedClients) wait() {
	s.mu.Lock()
	for _, c := range s.byKey {
		c.stop()
	}
	s.mu.Unlock()
	s.running.Wait()
}
