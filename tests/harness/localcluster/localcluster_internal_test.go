package localcluster

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/config"
)

// The executor accepts what WriteConfig writes, and reads back the keys and pools it was given.
func TestWriteConfig(t *testing.T) {
	e := &Env{Dir: t.TempDir(), BinDir: "/bin-dir"}
	caCert, caKey := e.AgentCA()
	for _, f := range []string{caCert, caKey} { // the config checks they exist
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("pem"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name                      string
		in                        Config
		pools                     []string
		defaultPool, egressProxy  string
		ready, kubeconfig, stages string
	}{
		{"defaults", Config{RunnerName: "r1"},
			[]string{Pool, PosixPool}, Pool, "", "1m30s", e.ExecutorKubeconfig(), "network"},
		{"everything", Config{
			RunnerName: "r2", Kubeconfig: "/k", ReadyTimeout: "5m", Extra: `stage_transport = "exec"`,
			Pools: append([]PoolConfig{{Name: "proxied", EgressProxy: EgressAdminAddr}}, Pools("other")...),
		}, []string{"proxied", "other", PosixPool}, "proxied", EgressAdminAddr, "5m0s", "/k", "exec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := e.WriteConfig(path, tc.in); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			var pools []string
			for _, p := range cfg.Pools {
				pools = append(pools, p.Name)
			}
			if !reflect.DeepEqual(pools, tc.pools) || cfg.DefaultPool != tc.defaultPool || cfg.Pools[0].EgressProxy != tc.egressProxy ||
				cfg.RunnerName != tc.in.RunnerName || cfg.ReadyTimeout.Duration.String() != tc.ready || cfg.Kubeconfig != tc.kubeconfig ||
				cfg.StageTransport != tc.stages || cfg.AgentBinary != e.AgentBinary() || cfg.AgentCACert != caCert || cfg.AgentCAKey != caKey ||
				(tc.egressProxy != "") != (cfg.EgressAdminCAFile != "") {
				t.Errorf("read back %+v", cfg)
			}
		})
	}
}
