// Package localcluster finds the local test cluster (make cluster-up) and our binaries, and
// writes the executor configuration and runner definition that point at them. The e2e tests,
// the benchmarks and the demo share it.
package localcluster

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

// What deploy/local installs.
const (
	Namespace = "sandbox-executor"
	Pool      = "duo-default"
	// Template is the hardened gVisor SandboxTemplate behind Pool.
	Template = "duo-gvisor"
	CIImage  = "sandbox-executor.local/ci:bookworm"
	// PosixImage has only POSIX sh and coreutils; pool PosixPool serves it.
	PosixImage = "sandbox-executor.local/posix:bookworm"
	PosixPool  = "duo-posix"
)

// Env is the local cluster and the executor binaries.
type Env struct {
	// Dir is CLUSTER_DIR: all of the cluster's state.
	Dir string
	// BinDir holds sandbox-executor and sandbox-executor-agent.
	BinDir string
}

// Find locates the cluster (CLUSTER_DIR, else $SANDBOX_EXECUTOR_CACHE/cluster, else
// ~/.cache/sandbox-executor/cluster) and the binaries ($SANDBOX_EXECUTOR_BIN), and checks that
// both are there.
func Find() (*Env, error) {
	dir, err := ClusterDir()
	if err != nil {
		return nil, err
	}
	e := &Env{Dir: dir, BinDir: os.Getenv("SANDBOX_EXECUTOR_BIN")}
	if e.BinDir == "" {
		return nil, errors.New("SANDBOX_EXECUTOR_BIN is not set: use the Makefile targets (make e2e, make demo)")
	}
	caCert, caKey := e.AgentCA()
	for _, f := range []string{e.ExecutorKubeconfig(), e.AdminKubeconfig(), e.Binary(), e.AgentBinary(), caCert, caKey} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%s missing: run `make build cluster-up` first", f)
		}
	}
	return e, nil
}

// ClusterDir is CLUSTER_DIR, else $SANDBOX_EXECUTOR_CACHE/cluster, else
// ~/.cache/sandbox-executor/cluster (as tests/cluster/lib.sh has it).
func ClusterDir() (string, error) {
	if dir := os.Getenv("CLUSTER_DIR"); dir != "" {
		return dir, nil
	}
	cache := os.Getenv("SANDBOX_EXECUTOR_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache", "sandbox-executor")
	}
	return filepath.Join(cache, "cluster"), nil
}

// ExecutorKubeconfig authenticates as the executor's ServiceAccount (the chart's Role, deploy/chart).
func (e *Env) ExecutorKubeconfig() string {
	return filepath.Join(e.Dir, "kubeconfig", "executor.kubeconfig")
}

// AdminKubeconfig has full rights, for tests that look at what the executor left behind.
func (e *Env) AdminKubeconfig() string { return filepath.Join(e.Dir, "kubeconfig", "admin.kubeconfig") }

// AgentCA is the cluster's agent CA (tests/cluster/certs.sh): certificate and key files.
func (e *Env) AgentCA() (cert, key string) {
	return filepath.Join(e.Dir, "pki", "agent-ca.crt"), filepath.Join(e.Dir, "pki", "agent-ca.key")
}

// Binary is the sandbox-executor binary.
func (e *Env) Binary() string { return filepath.Join(e.BinDir, "sandbox-executor") }

// StageLauncher is the stage launcher that prepare_exec, run_exec and cleanup_exec name beside a
// stage server (sandbox-executor-stage).
func (e *Env) StageLauncher() string { return filepath.Join(e.BinDir, "sandbox-executor-stage") }

// AgentBinary is the in-pod stage agent.
func (e *Env) AgentBinary() string { return filepath.Join(e.BinDir, "sandbox-executor-agent") }

// PoolConfig is a [[pool]] table of an executor configuration.
type PoolConfig struct {
	Name string
	// Images are the exact images the pool's template runs; ServeOtherTags also takes the jobs
	// naming other tags of them (serve_other_tags).
	Images         []string
	ServeOtherTags bool
	// EgressProxy is the pool's egress_proxy (the proxy's admin URL); empty for none.
	EgressProxy string
	// EgressInstance and EgressAllow are the pool's egress grants (docs/egress.md).
	EgressInstance bool
	EgressAllow    []string
}

// Pools are deploy/local's pools: the CI image served by ciPool (deploy/local's is Pool), and
// the POSIX image by PosixPool.
func Pools(ciPool string) []PoolConfig {
	return []PoolConfig{
		{Name: ciPool, Images: []string{CIImage}},
		{Name: PosixPool, Images: []string{PosixImage}},
	}
}

// EgressAdminTokenFile is the bearer token of the local egress proxy's admin API
// (deploy/local/egress-proxy.toml's admin_token_file): a test cluster's, committed.
func EgressAdminTokenFile() (string, error) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy", "local", "egress-admin.token"), nil
}

// EgressAdminAddr is the local egress proxy's admin API (tests/cluster/egress-proxy.sh): over
// TLS, with a certificate of EgressAdminCAFile's CA.
const EgressAdminAddr = "https://10.99.2.2:3129"

// EgressAdminCAFile is the CA of the local egress proxy's admin certificate
// (deploy/local/egress-proxy.toml's admin_tls_cert_file): a test cluster's, committed.
func EgressAdminCAFile() (string, error) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy", "local", "egress-admin-ca.crt"), nil
}

// EgressAdminHTTP is an HTTP client for the local egress proxy's admin API: direct, trusting
// EgressAdminCAFile's CA, bounded by timeout.
func EgressAdminHTTP(timeout time.Duration) (*http.Client, error) {
	file, err := EgressAdminCAFile()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no certificate", file)
	}
	hc := adminclient.HTTPClient(pool)
	hc.Timeout = timeout
	return hc, nil
}

// Config is an executor configuration for the local cluster.
type Config struct {
	RunnerName string
	// Kubeconfig is the executor's kubeconfig; empty means its ServiceAccount's
	// (ExecutorKubeconfig).
	Kubeconfig string
	// ReadyTimeout is prepare's ready_timeout; empty means 90s.
	ReadyTimeout string
	// Extra is added to the top-level keys.
	Extra string
	// Pools are the [[pool]] tables, the first one the default pool; none means Pools(Pool).
	Pools []PoolConfig
	// StageServer is the stage server's socket (stage_server); empty: none.
	StageServer string
}

// WriteConfig writes an executor configuration for the local cluster to path.
func (e *Env) WriteConfig(path string, c Config) error {
	if c.Kubeconfig == "" {
		c.Kubeconfig = e.ExecutorKubeconfig()
	}
	if c.ReadyTimeout == "" {
		c.ReadyTimeout = "90s"
	}
	if len(c.Pools) == 0 {
		c.Pools = Pools(Pool)
	}
	caCert, caKey := e.AgentCA()
	var b strings.Builder
	fmt.Fprintf(&b, "kubeconfig = %q\nnamespace = %q\nrunner_name = %q\ndefault_pool = %q\nagent_binary = %q\nready_timeout = %q\nagent_ca_cert = %q\nagent_ca_key = %q\n%s\n",
		c.Kubeconfig, Namespace, c.RunnerName, c.Pools[0].Name, e.AgentBinary(), c.ReadyTimeout, caCert, caKey, c.Extra)
	if c.StageServer != "" {
		fmt.Fprintf(&b, "stage_server = %q\n", c.StageServer)
	}
	if slices.ContainsFunc(c.Pools, func(p PoolConfig) bool { return p.EgressProxy != "" }) {
		token, err := EgressAdminTokenFile()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "egress_admin_token_file = %q\n", token)
		ca, err := EgressAdminCAFile()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "egress_admin_ca_file = %q\n", ca)
	}
	for _, p := range c.Pools {
		fmt.Fprintf(&b, "\n[[pool]]\nname = %q\n", p.Name)
		if len(p.Images) > 0 {
			images, err := json.Marshal(p.Images) // a TOML array of strings is also valid JSON
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "images = %s\n", images)
		}
		if p.ServeOtherTags {
			b.WriteString("serve_other_tags = true\n")
		}
		if p.EgressProxy != "" {
			fmt.Fprintf(&b, "egress_proxy = %q\n", p.EgressProxy)
		}
		if p.EgressInstance {
			b.WriteString("egress_instance = true\n")
		}
		if len(p.EgressAllow) > 0 {
			allow, err := json.Marshal(p.EgressAllow)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "egress_allow = %s\n", allow)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// CustomExecutor is the [runners.custom] section running our binary with configPath.
func (e *Env) CustomExecutor(configPath string) runner.CustomExecutor {
	args := func(stage string) []string { return []string{"--config", configPath, stage} }
	return runner.CustomExecutor{
		ConfigExec: e.Binary(), ConfigArgs: args("config"),
		PrepareExec: e.Binary(), PrepareArgs: args("prepare"), PrepareExecTimeout: 3 * time.Minute,
		RunExec: e.Binary(), RunArgs: args("run"),
		CleanupExec: e.Binary(), CleanupArgs: args("cleanup"), CleanupExecTimeout: time.Minute,
		GracefulKillTimeout: 30 * time.Second, ForceKillTimeout: 10 * time.Second,
	}
}
