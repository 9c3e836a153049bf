package kube

import (
	"errors"
	"net/http"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	sandboxclient "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned"
	extclient "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
)

// Clients bundles the typed clientsets and the exec transport. Tests build it from fakes.
type Clients struct {
	Kube       kubernetes.Interface
	Sandboxes  sandboxclient.Interface
	Extensions extclient.Interface
	Exec       RemoteExecutor
	// AgentLines, when set (the stage server), has the agents' identity lines read ahead.
	AgentLines *AgentLines
}

// RESTConfig builds the client config: kubeconfig and context from the config file, else the
// in-cluster service account, else the default loading rules ($KUBECONFIG, ~/.kube/config).
func RESTConfig(cfg *config.Config) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig == "" && cfg.Context == "" {
		rc, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			rc, err = loadKubeconfig("", "")
		}
	} else {
		rc, err = loadKubeconfig(cfg.Kubeconfig, cfg.Context)
	}
	if err != nil {
		return nil, failure.PermanentError(nil, "kubernetes client config (kubeconfig %q, context %q): %v", cfg.Kubeconfig, cfg.Context, err)
	}
	// One job makes a handful of calls, but many runners share an API server: keep client-side
	// throttling out of the way and let API priority and fairness do its job.
	rc.QPS, rc.Burst = 50, 100
	rc.UserAgent = "sandbox-executor"
	// A restarted API server denies until its authorizer has synced: requests of contexts marked
	// by RetryForbidden (the stages') are sent again for a while (forbidden.go).
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &forbiddenRetry{next: rt, clock: clock.RealClock{}}
	})
	return rc, nil
}

func loadKubeconfig(path, context string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
}

// NewClients connects to the cluster named by the config.
func NewClients(cfg *config.Config) (*Clients, error) {
	rc, err := RESTConfig(cfg)
	if err != nil {
		return nil, err
	}
	return ClientsFor(rc)
}

// ClientsFor connects to the cluster with a client config made elsewhere (the metrics adapter's
// flags).
func ClientsFor(rc *rest.Config) (*Clients, error) {
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, failure.PermanentError(err, "kubernetes client")
	}
	sbx, err := sandboxclient.NewForConfig(rc)
	if err != nil {
		return nil, failure.PermanentError(err, "agent-sandbox client")
	}
	ext, err := extclient.NewForConfig(rc)
	if err != nil {
		return nil, failure.PermanentError(err, "agent-sandbox extensions client")
	}
	pe := &podExec{config: rc, kube: kube}
	return &Clients{Kube: kube, Sandboxes: sbx, Extensions: ext, Exec: pe}, nil
}
