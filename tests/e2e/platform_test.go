//go:build e2e

package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// The local cluster's gVisor platform is a setting (RUNSC_PLATFORM, tests/cluster/configs.sh).
// configs.sh first starts a sandbox with the cluster's own runsc on that platform, so a platform
// this node cannot run fails `make cluster-up` with one line saying why, before any config names
// it. Each case runs configs.sh on a state directory of its own that holds only the cluster's
// runsc, so the shared cluster's configs are never touched.
func TestClusterPlatformSetting(t *testing.T) {
	t.Parallel()
	clusterDir, err := localcluster.ClusterDir()
	if err != nil {
		t.Fatal(err)
	}
	runsc := filepath.Join(clusterDir, "bin", "runsc")
	if _, err := os.Stat(runsc); err != nil {
		t.Fatalf("the cluster's runsc: %v", err)
	}
	kvmOK, kvmWhy := nodeKVM()
	for _, tc := range []struct {
		platform string
		works    bool
		why      string // what the error line must say when it does not
	}{
		{"systrap", true, ""},
		// A platform runsc does not know: the fault is caused, and the line names it.
		{"no-such-platform", false, "unknown platform: no-such-platform"},
		{"kvm", kvmOK, kvmWhy},
	} {
		t.Run(tc.platform, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(runsc, filepath.Join(dir, "bin", "runsc")); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out, err := clusterjobs.ClusterScript(ctx, "configs.sh",
				[]string{"CLUSTER_DIR=" + dir, "RUNSC_PLATFORM=" + tc.platform, "GVISOR_LOGS=0"})
			runscConfig, readErr := os.ReadFile(filepath.Join(dir, "etc", "runsc.toml"))
			if tc.works {
				if err != nil {
					t.Fatalf("configs.sh refused platform %s: %v\n%s", tc.platform, err, out)
				}
				if want := `platform = "` + tc.platform + `"`; !strings.Contains(string(runscConfig), want) {
					t.Errorf("runsc.toml lacks %s:\n%s", want, runscConfig)
				}
				return
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("configs.sh with platform %s: %v, want exit 1\n%s", tc.platform, err, out)
			}
			want := "[cluster] ERROR: RUNSC_PLATFORM=" + tc.platform + ": runsc cannot start a sandbox on this node: "
			if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 ||
				!strings.HasPrefix(lines[0], want) || !strings.Contains(lines[0], tc.why) {
				t.Errorf("output is not one line starting %q and saying %q:\n%s", want, tc.why, out)
			}
			if !errors.Is(readErr, os.ErrNotExist) {
				t.Errorf("runsc.toml written for a platform that cannot run (%v):\n%s", readErr, runscConfig)
			}
			if _, err := os.Stat(filepath.Join(dir, "etc", "containerd.toml")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("containerd.toml written for a platform that cannot run (%v)", err)
			}
		})
	}
}

// nodeKVM says whether gVisor's KVM platform can run on this node, and if not, what configs.sh
// must name: the node's /dev/kvm, read the way an operator would.
func nodeKVM() (bool, string) {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return false, "no /dev/kvm"
	}
	// PVM, a KVM backend that needs no VT-x, runs only guest kernels written for it.
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return false, "/dev/kvm is PVM (kvm_pvm)"
	}
	return true, ""
}
