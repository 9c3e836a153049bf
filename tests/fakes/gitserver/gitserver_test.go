package gitserver_test

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/gitserver"
)

// Like GitLab: the job token clones, only the agent's credentials push.
func authorize(user, password, repo string, access gitserver.Access) bool {
	if repo != "sandbox/hello" {
		return false
	}
	switch {
	case user == "gitlab-ci-token" && password == "job-token":
		return access == gitserver.Fetch
	case user == "duo" && password == "duo-password":
		return true
	}
	return false
}

// git runs the host's git as a client would, without any user configuration.
func git(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Agent", "GIT_AUTHOR_EMAIL=agent@example.com", "GIT_COMMITTER_NAME=Agent", "GIT_COMMITTER_EMAIL=agent@example.com")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestCloneAndPushWithTheirCredentials(t *testing.T) {
	server, err := gitserver.New(t.TempDir(), authorize)
	if err != nil {
		t.Fatal(err)
	}
	head, err := server.CreateRepo("sandbox/hello", "main", map[string]string{"README.md": "# hello\n", "src/index.js": "module.exports = 1\n"})
	if err != nil {
		t.Fatal(err)
	}
	web := httptest.NewServer(server)
	defer web.Close()
	host := strings.TrimPrefix(web.URL, "http://")
	work := t.TempDir()

	if out, err := git(t, work, "clone", "-q", "--depth", "1", "http://gitlab-ci-token:job-token@"+host+"/sandbox/hello.git", "clone"); err != nil {
		t.Fatalf("clone with the job token: %v\n%s", err, out)
	}
	clone := filepath.Join(work, "clone")
	if got, _ := git(t, clone, "rev-parse", "HEAD"); strings.TrimSpace(got) != head {
		t.Errorf("cloned HEAD %s, want %s", got, head)
	}
	if data, err := os.ReadFile(filepath.Join(clone, "src/index.js")); err != nil || string(data) != "module.exports = 1\n" {
		t.Errorf("cloned file: %q %v", data, err)
	}

	os.WriteFile(filepath.Join(clone, "CHANGE.md"), []byte("changed\n"), 0o644)
	if out, err := git(t, clone, "add", "CHANGE.md"); err != nil {
		t.Fatal(out)
	}
	if out, err := git(t, clone, "commit", "-qm", "Change"); err != nil {
		t.Fatal(out)
	}
	out, err := git(t, clone, "push", "origin", "HEAD:refs/heads/duo/change")
	if err == nil || !strings.Contains(out, "not allowed to push") {
		t.Errorf("push with the job token: %v\n%s; want it refused", err, out)
	}
	out, err = git(t, clone, "push", "http://duo:wrong@"+host+"/sandbox/hello.git", "HEAD:refs/heads/duo/change")
	if err == nil || !strings.Contains(out, "Authentication failed") {
		t.Errorf("push with a wrong password: %v\n%s; want it refused", err, out)
	}
	if out, err := git(t, clone, "push", "-q", "http://duo:duo-password@"+host+"/sandbox/hello.git", "HEAD:refs/heads/duo/change"); err != nil {
		t.Fatalf("push with the agent's credentials: %v\n%s", err, out)
	}
	if got, err := server.RepoGit("sandbox/hello", "show", "duo/change:CHANGE.md"); err != nil || got != "changed" {
		t.Errorf("pushed file in the bare repo: %q %v", got, err)
	}
	if got, _ := server.RepoGit("sandbox/hello", "rev-parse", "duo/change~1"); got != head {
		t.Errorf("the pushed commit's parent is %s, want %s", got, head)
	}

	if out, err := git(t, work, "ls-remote", "http://"+host+"/sandbox/hello.git"); err == nil {
		t.Errorf("anonymous ls-remote succeeded:\n%s", out)
	}
	if out, err := git(t, work, "ls-remote", "http://gitlab-ci-token:job-token@"+host+"/sandbox/other.git"); err == nil {
		t.Errorf("ls-remote of a repository the token may not read succeeded:\n%s", out)
	}
}
