package adminclient_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

// The executor and its stages reach the egress proxy through this package alone: they link
// none of the proxy's server (package egress: the forwarder, the recorder, the TOML config).
func TestStagesLinkNoProxyServer(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	list := exec.Command("go", "list", "-deps", "./cmd/sandbox-executor", "./stages/...")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const server = "github.com/sandbox-executor/sandbox-executor/egress"
	deps := strings.Fields(string(out))
	for _, pkg := range deps {
		if pkg == server {
			t.Errorf("the executor links the egress proxy's server %s", pkg)
		}
	}
	if !strings.Contains(string(out), server+"/adminclient\n") {
		t.Errorf("the executor does not link %s/adminclient: is this test still looking at the right binary?", server)
	}
}
