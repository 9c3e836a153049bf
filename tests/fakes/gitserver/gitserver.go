// Package gitserver serves bare git repositories over git's smart HTTP protocol, as a GitLab
// instance does for jobs: `git http-backend` (from the host's git) behind net/http/cgi, with
// HTTP basic auth and a separate decision for fetches and pushes. Repositories live under a
// root directory at their project path: <root>/<namespace>/<name>.git.
package gitserver

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Access is what a request asks for.
type Access int

const (
	// Fetch is clone, fetch and ls-remote (git-upload-pack).
	Fetch Access = iota
	// Push is git-receive-pack.
	Push
)

// Authorizer decides whether user, with password, may do access on the repository at
// project path repo ("sandbox/hello").
type Authorizer func(user, password, repo string, access Access) bool

// Server is an http.Handler for the repositories under Root. Create it with New.
type Server struct {
	root      string
	authorize Authorizer
	git       string
}

// New serves the bare repositories under root, asking authorize about every request.
func New(root string, authorize Authorizer) (*Server, error) {
	git, err := exec.LookPath("git")
	if err != nil {
		return nil, errors.New("gitserver: git is not installed (apt-get install git)")
	}
	return &Server{root: root, authorize: authorize, git: git}, nil
}

// ServeHTTP answers git's smart HTTP requests: GET <repo>.git/info/refs?service=...,
// POST <repo>.git/git-upload-pack and POST <repo>.git/git-receive-pack.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	repo, _, found := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), ".git/")
	if !found || repo == "" || strings.Contains(repo, "..") {
		http.NotFound(w, r)
		return
	}
	access := Fetch
	if r.URL.Query().Get("service") == "git-receive-pack" || strings.HasSuffix(r.URL.Path, "/git-receive-pack") {
		access = Push
	}
	user, password, ok := r.BasicAuth()
	if !ok {
		// git sends credentials only once asked for them.
		w.Header().Set("WWW-Authenticate", `Basic realm="GitLab"`)
		http.Error(w, "HTTP Basic: Access denied", http.StatusUnauthorized)
		return
	}
	if !s.authorize(user, password, repo, access) {
		if access == Push && s.authorize(user, password, repo, Fetch) {
			http.Error(w, "You are not allowed to push code to this project.", http.StatusForbidden)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="GitLab"`)
		http.Error(w, "HTTP Basic: Access denied", http.StatusUnauthorized)
		return
	}
	if _, err := os.Stat(filepath.Join(s.root, repo+".git", "HEAD")); err != nil {
		http.NotFound(w, r)
		return
	}
	backend := &cgi.Handler{
		Path: s.git,
		Args: []string{"http-backend"},
		Env: []string{
			"GIT_PROJECT_ROOT=" + s.root,
			"GIT_HTTP_EXPORT_ALL=1",
			// http-backend enables receive-pack only for an authenticated user.
			"REMOTE_USER=" + user,
			"GIT_CONFIG_NOSYSTEM=1",
			"GIT_CONFIG_GLOBAL=/dev/null",
		},
		Stderr: os.Stderr,
	}
	backend.ServeHTTP(w, r)
}

// CreateRepo makes a bare repository at project path repo under the server's root whose
// branch has one commit with files (path -> content), and returns the commit's ID.
func (s *Server) CreateRepo(repo, branch string, files map[string]string) (string, error) {
	work, err := os.MkdirTemp("", "gitserver-seed")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	paths := make([]string, 0, len(files))
	for path, content := range files {
		full := filepath.Join(work, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			return "", err
		}
		paths = append(paths, path)
	}
	sort.Strings(paths)
	bare := filepath.Join(s.root, repo+".git")
	steps := [][]string{
		{"-C", work, "init", "-q", "-b", branch},
		append([]string{"-C", work, "add", "--"}, paths...),
		{"-C", work, "-c", "user.name=Seed", "-c", "user.email=seed@example.com", "commit", "-q", "-m", "Initial commit"},
		{"init", "-q", "--bare", "-b", branch, bare},
		{"-C", work, "push", "-q", bare, branch},
	}
	for _, args := range steps {
		if _, err := s.Git(args...); err != nil {
			return "", err
		}
	}
	return s.Git("--git-dir", bare, "rev-parse", "refs/heads/"+branch)
}

// RepoGit runs git on the bare repository at project path repo, returning its trimmed stdout.
func (s *Server) RepoGit(repo string, args ...string) (string, error) {
	return s.Git(append([]string{"--git-dir", filepath.Join(s.root, repo+".git")}, args...)...)
}

// Git runs the host's git without user or system configuration, returning its trimmed stdout.
func (s *Server) Git(args ...string) (string, error) {
	cmd := exec.Command(s.git, args...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}
