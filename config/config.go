// Package config loads and validates the executor's TOML configuration once per stage invocation.
package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"k8s.io/apimachinery/pkg/util/validation"
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

	// Reconnects bounds how often one stage re-attaches after its stream drops.
	Reconnects int `toml:"reconnects"`

	// Debug adds diagnostic lines to the job log.
	Debug bool `toml:"debug"`

	// path is the file this config was read from, for error messages.
	path string
}

// Pool maps image patterns onto a SandboxWarmPool.
type Pool struct {
	Name   string   `toml:"name"`
	Images []string `toml:"images"`
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
	cfg := &Config{path: path}
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
	cfg.applyDefaults()
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

func (c *Config) applyDefaults() {
	if c.DrainedPool == "" {
		c.DrainedPool = DrainedPoolCold
	}
	if c.UnknownImage == "" {
		c.UnknownImage = UnknownImageReject
	}
	if c.RuntimeClasses == nil {
		c.RuntimeClasses = []string{"gvisor"}
	}
	if c.BuildsDir == "" {
		c.BuildsDir = "/builds"
	}
	if c.CacheDir == "" {
		c.CacheDir = "/cache"
	}
	if c.ReadyTimeout.Duration == 0 {
		c.ReadyTimeout.Duration = 2 * time.Minute
	}
	if c.ClaimGrace.Duration == 0 {
		c.ClaimGrace.Duration = 15 * time.Minute
	}
	if c.CleanupTimeout.Duration == 0 {
		c.CleanupTimeout.Duration = 30 * time.Second
	}
	if c.StageTransport == "" {
		c.StageTransport = TransportExec
		if c.AgentCACert != "" {
			c.StageTransport = TransportNetwork
		}
	}
	if c.Reconnects == 0 {
		c.Reconnects = 10
	}
	if c.RunnerName == "" {
		if h, err := os.Hostname(); err == nil {
			c.RunnerName = h
		}
	}
}

func (c *Config) validate() error {
	fail := func(key, format string, args ...any) error {
		return &Error{Path: c.path, Key: key, Msg: fmt.Sprintf(format, args...)}
	}
	if c.Namespace == "" {
		return fail("namespace", "is required")
	}
	if !isDNSLabel(c.Namespace) {
		return fail("namespace", "%q is not a valid namespace name", c.Namespace)
	}
	if c.RunnerName == "" {
		return fail("runner_name", "is required (the host name could not be read)")
	}
	if len(c.Pools) == 0 {
		return fail("pool", "at least one [[pool]] is required")
	}
	seen := map[string]bool{}
	for i, p := range c.Pools {
		key := fmt.Sprintf("pool[%d]", i)
		if p.Name == "" {
			return fail(key+".name", "is required")
		}
		if !isDNSSubdomain(p.Name) {
			return fail(key+".name", "%q is not a valid SandboxWarmPool name", p.Name)
		}
		if seen[p.Name] {
			return fail(key+".name", "pool %q is listed twice", p.Name)
		}
		seen[p.Name] = true
		if bad, ok := badImagePattern(p.Images); ok {
			return fail(key+".images", "bad image pattern %q", bad)
		}
		if p.EgressProxy != "" {
			if u, err := url.Parse(p.EgressProxy); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
				return fail(key+".egress_proxy", "%q is not an http(s)://host:port URL of the egress proxy's admin address", p.EgressProxy)
			}
		}
		switch {
		case p.GrantsEgress() && p.EgressProxy == "":
			return fail(key+".egress_proxy", "is required with egress_instance or egress_allow: the grants go to the egress proxy")
		case p.EgressInstanceWildcard && !p.EgressInstance:
			return fail(key+".egress_instance_wildcard", "needs egress_instance = true")
		case slices.Contains(p.EgressAllow, ""):
			return fail(key+".egress_allow", "has an empty entry")
		}
	}
	if c.DefaultPool != "" && !seen[c.DefaultPool] {
		return fail("default_pool", "%q is not one of the [[pool]] names (%s)", c.DefaultPool, strings.Join(c.PoolNames(), ", "))
	}
	if c.DrainedPool != DrainedPoolCold && c.DrainedPool != DrainedPoolWait {
		return fail("drained_pool", "%q is not one of cold, wait", c.DrainedPool)
	}
	switch c.UnknownImage {
	case UnknownImageReject, UnknownImageCold:
	default:
		return fail("unknown_image", "%q is not one of reject, cold", c.UnknownImage)
	}
	if err := c.validateColdStart(fail); err != nil {
		return err
	}
	if len(c.RuntimeClasses) == 0 {
		return fail("runtime_classes", "must list at least one RuntimeClass (fail-closed isolation)")
	}
	for _, dir := range []struct{ key, value string }{{"builds_dir", c.BuildsDir}, {"cache_dir", c.CacheDir}} {
		if !path.IsAbs(dir.value) {
			return fail(dir.key, "%q must be an absolute path inside the job pod", dir.value)
		}
	}
	for _, d := range []struct {
		key   string
		value time.Duration
	}{{"ready_timeout", c.ReadyTimeout.Duration}, {"claim_grace", c.ClaimGrace.Duration}, {"cleanup_timeout", c.CleanupTimeout.Duration}} {
		if d.value < 0 {
			return fail(d.key, "must be positive, got %s", d.value)
		}
	}
	if c.HelperBinary != "" {
		if err := checkExecutable(c.HelperBinary); err != nil {
			return fail("helper_binary", "%s", err)
		}
	}
	if c.StageTransport != TransportExec && c.StageTransport != TransportNetwork {
		return fail("stage_transport", "%q is not one of exec, network", c.StageTransport)
	}
	if (c.AgentCACert == "") != (c.AgentCAKey == "") {
		return fail("agent_ca_key", "agent_ca_cert and agent_ca_key go together (sandbox-executor tls init makes both)")
	}
	if c.StageTransport == TransportNetwork && c.AgentCACert == "" {
		return fail("stage_transport", "\"network\" needs the agent CA: set agent_ca_cert and agent_ca_key (sandbox-executor tls init makes them; docs/security.md), or use \"exec\"")
	}
	for _, f := range []struct{ key, value string }{{"agent_ca_cert", c.AgentCACert}, {"agent_ca_key", c.AgentCAKey}} {
		if f.value == "" {
			continue
		}
		if _, err := os.Stat(f.value); err != nil {
			return fail(f.key, "%v", err)
		}
	}
	if c.Reconnects < 0 {
		return fail("reconnects", "must not be negative")
	}
	if _, err := c.EgressAdminToken(); err != nil {
		return fail("egress_admin_token_file", "%v", err)
	}
	if c.StageServer != "" {
		if err := c.validateForStageServer(fail); err != nil {
			return err
		}
	}
	return nil
}

// validateForStageServer: the stage server reads the config in another process, with another
// working directory, so every path in it must be absolute.
func (c *Config) validateForStageServer(fail func(key, format string, args ...any) error) error {
	for _, f := range []struct{ key, value string }{
		{"stage_server", c.StageServer}, {"kubeconfig", c.Kubeconfig}, {"agent_ca_cert", c.AgentCACert},
		{"agent_ca_key", c.AgentCAKey}, {"agent_binary", c.AgentBinary}, {"helper_binary", c.HelperBinary},
	} {
		if f.value != "" && !filepath.IsAbs(f.value) {
			return fail(f.key, "%q must be an absolute path with stage_server set (the stage server has its own working directory)", f.value)
		}
	}
	return nil
}

// validateColdStart checks cold_template and cold_images: both required with unknown_image =
// "cold", neither allowed without it (a forgotten policy switch must not go unnoticed).
func (c *Config) validateColdStart(fail func(key, format string, args ...any) error) error {
	if c.UnknownImage != UnknownImageCold {
		switch {
		case c.ColdTemplate != "":
			return fail("cold_template", "is only used with unknown_image = \"cold\" (unknown_image is %q)", c.UnknownImage)
		case len(c.ColdImages) > 0:
			return fail("cold_images", "is only used with unknown_image = \"cold\" (unknown_image is %q)", c.UnknownImage)
		}
		return nil
	}
	switch {
	case c.ColdTemplate == "":
		return fail("cold_template", "is required with unknown_image = \"cold\": the SandboxTemplate cold starts are made from")
	case !isDNSSubdomain(c.ColdTemplate):
		return fail("cold_template", "%q is not a valid SandboxTemplate name", c.ColdTemplate)
	case len(c.ColdImages) == 0:
		return fail("cold_images", "is required with unknown_image = \"cold\": the image patterns that may be cold-started")
	}
	if bad, ok := badImagePattern(c.ColdImages); ok {
		return fail("cold_images", "bad image pattern %q", bad)
	}
	return nil
}

// badImagePattern returns the first pattern that is empty or not path.Match syntax.
func badImagePattern(patterns []string) (string, bool) {
	for _, pattern := range patterns {
		if _, err := path.Match(pattern, ""); err != nil || pattern == "" {
			return pattern, true
		}
	}
	return "", false
}

// checkExecutable accepts a path to an executable regular file; the message says what it is
// instead.
func checkExecutable(file string) error {
	if !path.IsAbs(file) {
		return fmt.Errorf("%q must be an absolute path on the runner host", file)
	}
	info, err := os.Stat(file)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s does not exist", file)
	case err != nil:
		return fmt.Errorf("%s: %v", file, unwrapPathError(err))
	case !info.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", file)
	case info.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%s is not executable", file)
	}
	return nil
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// PoolNames lists the configured pools, for messages.
func (c *Config) PoolNames() []string {
	names := make([]string, 0, len(c.Pools))
	for _, p := range c.Pools {
		names = append(names, p.Name)
	}
	return names
}

// Pool returns the named pool, or nil.
func (c *Config) Pool(name string) *Pool {
	for i := range c.Pools {
		if c.Pools[i].Name == name {
			return &c.Pools[i]
		}
	}
	return nil
}

// AllowedImages lists every image pattern some pool serves, sorted, for messages.
func (c *Config) AllowedImages() []string {
	var images []string
	for _, p := range c.Pools {
		images = append(images, p.Images...)
	}
	sort.Strings(images)
	return images
}

// ErrImageNotAllowed is returned by PoolFor for images that no pool serves.
var ErrImageNotAllowed = errors.New("image not allowed")

// PoolFor picks the pool serving image. An empty image goes to default_pool. Patterns use
// path.Match syntax, where "*" does not cross "/": "node:*" matches "node:22" but not
// "evil/node:22", so a pattern never widens to another registry or namespace by accident.
func (c *Config) PoolFor(image string) (string, error) {
	if image == "" {
		if c.DefaultPool == "" {
			return "", fmt.Errorf("%w: the job sets no image and no default_pool is configured", ErrImageNotAllowed)
		}
		return c.DefaultPool, nil
	}
	for _, p := range c.Pools {
		if matchesAny(p.Images, image) {
			return p.Name, nil
		}
	}
	allowed := c.AllowedImages()
	if len(allowed) == 0 {
		return "", fmt.Errorf("%w: %q: no pool serves any image; remove image: from the job to use default_pool", ErrImageNotAllowed, image)
	}
	return "", fmt.Errorf("%w: %q: allowed images are %s", ErrImageNotAllowed, image, strings.Join(allowed, ", "))
}

// Placement is where a job runs: a warm pool, or a cold start from a template (unknown_image =
// "cold"). Exactly one field is set.
type Placement struct {
	Pool         string
	ColdTemplate string
}

// Place picks where image runs: the pool serving it (PoolFor), else, with unknown_image = "cold",
// a cold start from cold_template if a cold_images pattern matches. An image allowed by neither
// is ErrImageNotAllowed, naming both lists.
func (c *Config) Place(image string) (Placement, error) {
	pool, err := c.PoolFor(image)
	if err == nil {
		return Placement{Pool: pool}, nil
	}
	if c.UnknownImage != UnknownImageCold || image == "" {
		return Placement{}, err
	}
	if matchesAny(c.ColdImages, image) {
		return Placement{ColdTemplate: c.ColdTemplate}, nil
	}
	cold := slices.Sorted(slices.Values(c.ColdImages))
	return Placement{}, fmt.Errorf("%w; cold starts (unknown_image = \"cold\") allow %s", err, strings.Join(cold, ", "))
}

// matchesAny reports whether image matches one of the patterns. Patterns use path.Match syntax,
// where "*" does not cross "/".
func matchesAny(patterns []string, image string) bool {
	for _, pattern := range patterns {
		if ok, _ := path.Match(pattern, image); ok {
			return true
		}
	}
	return false
}

func isDNSLabel(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }

func isDNSSubdomain(s string) bool { return len(validation.IsDNS1123Subdomain(s)) == 0 }
