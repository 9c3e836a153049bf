// Package config loads and validates the executor's TOML configuration once per stage invocation.
package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// EnvVar names the environment variable that points at the config file when --config is not given.
const EnvVar = "SANDBOX_EXECUTOR_CONFIG"

// DefaultPath is used when neither --config nor $SANDBOX_EXECUTOR_CONFIG is set.
const DefaultPath = "/etc/sandbox-executor/config.toml"

// Policies for images that no pool serves.
const (
	UnknownImageReject = "reject"
	UnknownImageCold   = "cold"

	DrainedPoolCold = "cold"
	DrainedPoolWait = "wait"
)

// Stage transports.
const (
	TransportExec    = "exec"
	TransportNetwork = "network"
)

// Config is the executor's configuration. Field tags are the TOML keys users write.
type Config struct {
	// Kubeconfig is a kubeconfig path; empty means in-cluster config, falling back to the
	// default loading rules ($KUBECONFIG, ~/.kube/config) outside a cluster.
	Kubeconfig string `toml:"kubeconfig"`
	Context    string `toml:"context"`
	Namespace  string `toml:"namespace"`

	// RunnerName scopes claim names and labels to one runner, so several runners can share a
	// namespace and gc only reaps its own claims. Defaults to the host name.
	RunnerName string `toml:"runner_name"`

	Pools        []Pool `toml:"pool"`
	DefaultPool  string `toml:"default_pool"`
	UnknownImage string `toml:"unknown_image"`

	// ColdTemplate and ColdImages serve unknown_image = "cold": an image no pool serves but
	// that matches a ColdImages pattern runs in a Sandbox created from the SandboxTemplate
	// ColdTemplate with that image in its first container (a cold start).
	ColdTemplate string   `toml:"cold_template"`
	ColdImages   []string `toml:"cold_images"`

	// DrainedPool is what prepare does when the job's pool has no ready sandbox: "cold" (the
	// default: claim at once; agent-sandbox hands out a pool sandbox still booting, or starts one
	// from the pool's template, a cold start of seconds) or "wait" (watch the pool until a
	// sandbox is ready, up to ready_timeout, then claim it: a burst of jobs then never starts more
	// pods than the pool refills).
	DrainedPool string `toml:"drained_pool"`

	// RuntimeClasses lists the RuntimeClass names a job pod may run under; any other pod is
	// refused before a script runs.
	RuntimeClasses []string `toml:"runtime_classes"`

	// RequireFence refuses pods whose template configures no egress fence check
	// (SANDBOX_EXECUTOR_FENCE_DENY/ALLOW): without it such pods run unchecked, and doctor warns.
	// A configured fence that does not hold fails prepare either way.
	RequireFence bool `toml:"require_fence"`

	// BuildsDir and CacheDir are paths inside the job pod.
	BuildsDir string `toml:"builds_dir"`
	CacheDir  string `toml:"cache_dir"`

	// AgentBinary is the in-pod stage agent copied into every job pod at prepare. Defaults to
	// sandbox-executor-agent next to the executor binary.
	AgentBinary string `toml:"agent_binary"`

	// HelperBinary is the runner's own binary (gitlab-runner, a static Linux build) on this
	// host, copied into every job pod at prepare and put on PATH there: the cache and artifacts
	// stages call `gitlab-runner cache-extractor|cache-archiver|artifacts-*` inside the job's
	// environment, whatever its image. Empty: not copied (jobs without cache and artifacts).
	HelperBinary string `toml:"helper_binary"`

	ReadyTimeout   Duration `toml:"ready_timeout"`
	ClaimGrace     Duration `toml:"claim_grace"`
	CleanupTimeout Duration `toml:"cleanup_timeout"`

	// StageTransport is how stages reach the pod: "network" (straight to the pod's stage agent
	// over the pod network, TLS 1.3 authenticated both ways: the runner by a client certificate
	// of the agent CA below, the agent by its key, pinned from its pod's log; prepare falls back
	// to exec for the whole job when the runner cannot reach the pod) or "exec" (through the API
	// server only: for runners outside the cluster network). The default is network when the
	// agent CA is configured, else exec.
	StageTransport string `toml:"stage_transport"`

	// AgentCACert and AgentCAKey are the agent CA (PEM files; `sandbox-executor tls init`
	// makes them): the network transport's client certificates are signed with the key, which
	// stays with the runners, and the pods trust the certificate (SANDBOX_EXECUTOR_AGENT_CLIENT_CA
	// in their SandboxTemplate, from a ConfigMap). See docs/security.md.
	AgentCACert string `toml:"agent_ca_cert"`
	AgentCAKey  string `toml:"agent_ca_key"`

	// StageServer is the Unix socket of `sandbox-executor serve`, a long-running process beside
	// gitlab-runner (same host or container, same user) that keeps the cluster connection and the
	// Go runtime warm: prepare and cleanup hand their work to it instead of starting cold. Unset:
	// every stage works in its own process. A socket nobody listens on is the same, with a
	// warning in the job log.
	StageServer string `toml:"stage_server"`

	// EgressAdminTokenFile holds the bearer token of the egress proxies' admin API (their
	// admin_token_file); see egress_admin.go.
	EgressAdminTokenFile string `toml:"egress_admin_token_file"`
	// EgressAdminCAFile holds the CA certificates (PEM) that verify the egress proxies' admin
	// certificates (https egress_proxy addresses; the proxy's admin_tls_cert_file); unset: the
	// system's roots. See egress_admin.go.
	EgressAdminCAFile string `toml:"egress_admin_ca_file"`

	// Reconnects bounds how often one stage re-attaches after its stream drops.
	Reconnects int `toml:"reconnects"`

	// Debug adds diagnostic lines to the job log.
	Debug bool `toml:"debug"`

	// path is the file this config was read from, for error messages.
	path string
}

// Pool maps images onto a SandboxWarmPool.
type Pool struct {
	Name string `toml:"name"`
	// Images are the exact references of the image the pool's template runs (a job naming one
	// runs here; "node:22" and "docker.io/library/node:22" are one image). No patterns: a pool
	// whose pods run one image must not take a job that asked for another without saying so.
	Images []string `toml:"images"`
	// ServeOtherTags also sends here the jobs that name another tag or digest of the
	// repositories in Images (e.g. a newer release of GitLab's default flow image): they run in
	// the pool's image, and the job log warns which image was asked for and which one runs.
	ServeOtherTags bool `toml:"serve_other_tags"`
	// EgressProxy is the admin address of the egress proxy this pool's pods are forced through
	// (e.g. "http://10.0.0.5:3129"): after each stage, run lists the attempts it blocked.
	EgressProxy string `toml:"egress_proxy"`
	// EgressInstance grants each job's pod, through EgressProxy and for the job's lifetime, the
	// job's GitLab instance as the job JSON names it (CI_SERVER_URL), like SRT's allowlist in
	// GitLab's default flow image: no instance is configured anywhere (docs/egress.md).
	EgressInstance bool `toml:"egress_instance"`
	// EgressInstanceWildcard also grants every name below the instance's (*.gitlab.example.com).
	EgressInstanceWildcard bool `toml:"egress_instance_wildcard"`
	// EgressAllow are allowlist entries (the egress proxy's syntax) granted to every job of the
	// pool, e.g. the npm registry for images without the duo CLI.
	EgressAllow []string `toml:"egress_allow"`
}

// GrantsEgress tells whether prepare gives the pool's jobs egress grants.
func (p *Pool) GrantsEgress() bool { return p.EgressInstance || len(p.EgressAllow) > 0 }

// Duration is a time.Duration written as a Go duration string ("90s", "5m").
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler for TOML strings.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil {
		return fmt.Errorf("not a duration (use e.g. 90s, 5m): %q", text)
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Error is a configuration error; it names the file and, where known, the key.
type Error struct {
	Path string
	Key  string
	Msg  string
}

func (e *Error) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("config %s: %s", e.Path, e.Msg)
	}
	return fmt.Sprintf("config %s: %s: %s", e.Path, e.Key, e.Msg)
}

// ResolvePath picks the config file: the flag, else $SANDBOX_EXECUTOR_CONFIG, else DefaultPath.
func ResolvePath(flagValue string, getenv func(string) string) string {
	if flagValue != "" {
		return flagValue
	}
	if v := getenv(EnvVar); v != "" {
		return v
	}
	return DefaultPath
}

// Load reads, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, &Error{Path: path, Msg: "file not found (set --config or $" + EnvVar + ")"}
		}
		return nil, &Error{Path: path, Msg: err.Error()}
	}
	return Parse(path, data)
}

// Parse decodes TOML text; path is only used in messages.
func Parse(path string, data []byte) (*Config, error) {
	cfg := defaults()
	cfg.path = path
	md, err := toml.Decode(string(data), cfg)
	if err != nil {
		return nil, decodeError(path, err)
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		key := undecoded[0].String()
		msg := "unknown key"
		if len(undecoded[0]) == 2 && undecoded[0][0] == "pool" && isTopLevelKey(undecoded[0][1]) {
			msg += " (top-level keys must come before the first [[pool]] table)"
		}
		return nil, &Error{Path: path, Key: key, Msg: msg}
	}
	cfg.deriveDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Path is the file the config was loaded from.
func (c *Config) Path() string { return c.path }

// isTopLevelKey reports whether key is one of Config's own TOML keys.
func isTopLevelKey(key string) bool {
	t := reflect.TypeOf(Config{})
	for i := 0; i < t.NumField(); i++ {
		if strings.Split(t.Field(i).Tag.Get("toml"), ",")[0] == key {
			return true
		}
	}
	return false
}

func decodeError(path string, err error) error {
	var perr toml.ParseError
	if errors.As(err, &perr) {
		msg := perr.Message
		if perr.Position.Line > 0 {
			msg = fmt.Sprintf("line %d: %s", perr.Position.Line, msg)
		}
		return &Error{Path: path, Key: perr.LastKey, Msg: msg}
	}
	// Type mismatches ("toml: line 3 (last key "ready_timeout"): ...") already name the key.
	return &Error{Path: path, Msg: strings.TrimPrefix(err.Error(), "toml: ")}
}

// defaults is the config before the file is decoded onto it: a key the file sets, to zero
// included, keeps the file's value, which validate then accepts or refuses (a zero timeout) in one
// line, instead of a zero silently becoming the default.
func defaults() *Config {
	c := &Config{
		DrainedPool:    DrainedPoolCold,
		UnknownImage:   UnknownImageReject,
		RuntimeClasses: []string{"gvisor"},
		BuildsDir:      "/builds",
		CacheDir:       "/cache",
		ReadyTimeout:   Duration{2 * time.Minute},
		ClaimGrace:     Duration{15 * time.Minute},
		CleanupTimeout: Duration{30 * time.Second},
		// Zero is allowed: a stage that never re-attaches after its stream drops.
		Reconnects: 10,
	}
	if h, err := os.Hostname(); err == nil {
		c.RunnerName = h
	}
	return c
}

// deriveDefaults fills what depends on other keys: the transport follows the agent CA.
func (c *Config) deriveDefaults() {
	if c.StageTransport == "" {
		c.StageTransport = TransportExec
		if c.AgentCACert != "" {
			c.StageTransport = TransportNetwork
		}
	}
}
