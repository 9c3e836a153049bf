package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// checks are the config's checks, in the order their errors are reported: the first that fails
// is the config's error, one line naming the key to fix.
var checks = []func(c *Config) error{
	(*Config).checkIdentity,
	(*Config).checkPools,
	(*Config).checkPolicies,
	(*Config).checkColdStart,
	(*Config).checkPodLayout,
	(*Config).checkTimeouts,
	(*Config).checkHelper,
	(*Config).checkTransport,
	(*Config).checkReconnects,
	(*Config).checkEgressAdminToken,
	(*Config).checkForStageServer,
}

func (c *Config) validate() error {
	for _, check := range checks {
		if err := check(c); err != nil {
			return err
		}
	}
	return nil
}

// fail is the config's error at key.
func (c *Config) fail(key, format string, args ...any) error {
	return &Error{Path: c.path, Key: key, Msg: fmt.Sprintf(format, args...)}
}

// checkIdentity: the namespace and the runner's name, which every object's name and label carry.
func (c *Config) checkIdentity() error {
	switch {
	case c.Namespace == "":
		return c.fail("namespace", "is required")
	case !isDNSLabel(c.Namespace):
		return c.fail("namespace", "%q is not a valid namespace name", c.Namespace)
	case c.RunnerName == "":
		return c.fail("runner_name", "is required (the host name could not be read)")
	}
	return nil
}

// checkPools: at least one pool, each named once, with valid image patterns and egress grants.
func (c *Config) checkPools() error {
	if len(c.Pools) == 0 {
		return c.fail("pool", "at least one [[pool]] is required")
	}
	seen := map[string]bool{}
	for i, p := range c.Pools {
		key := fmt.Sprintf("pool[%d]", i)
		if p.Name == "" {
			return c.fail(key+".name", "is required")
		}
		if !isDNSSubdomain(p.Name) {
			return c.fail(key+".name", "%q is not a valid SandboxWarmPool name", p.Name)
		}
		if seen[p.Name] {
			return c.fail(key+".name", "pool %q is listed twice", p.Name)
		}
		seen[p.Name] = true
		if err := c.checkPoolImages(key, p); err != nil {
			return err
		}
		if p.EgressProxy != "" {
			if u, err := url.Parse(p.EgressProxy); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
				return c.fail(key+".egress_proxy", "%q is not an http(s)://host:port URL of the egress proxy's admin address", p.EgressProxy)
			}
		}
		switch {
		case p.GrantsEgress() && p.EgressProxy == "":
			return c.fail(key+".egress_proxy", "is required with egress_instance or egress_allow: the grants go to the egress proxy")
		case p.EgressInstanceWildcard && !p.EgressInstance:
			return c.fail(key+".egress_instance_wildcard", "needs egress_instance = true")
		case slices.Contains(p.EgressAllow, ""):
			return c.fail(key+".egress_allow", "has an empty entry")
		}
	}
	return nil
}

// checkPoolImages: a pool lists the exact images its template runs; other tags of them only
// with serve_other_tags, never through a pattern.
func (c *Config) checkPoolImages(key string, p Pool) error {
	for _, image := range p.Images {
		switch problem := imageRefProblem(image); {
		case isImagePattern(image):
			return c.fail(key+".images", "%q is a pattern: list the exact image the pool's template runs (e.g. %s), and set serve_other_tags = true to send it the jobs that ask for other tags of it",
				image, exampleExactImage(image))
		case problem != "":
			return c.fail(key+".images", "%q %s: list the exact image the pool's template runs, e.g. node:22", image, problem)
		}
	}
	if p.ServeOtherTags && len(p.Images) == 0 {
		return c.fail(key+".serve_other_tags", "needs images: the exact image the pool's template runs, whose other tags it serves")
	}
	return nil
}

// exampleExactImage turns a pattern of tags like "node:*" into the exact reference that replaces
// it ("node:<tag>"); a pattern over names gets a plain example.
func exampleExactImage(pattern string) string {
	name, _, _ := strings.Cut(pattern, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	if name == "" || isImagePattern(name) {
		return "node:22"
	}
	return name + ":<tag>"
}

// checkPolicies: default_pool names a pool; drained_pool and unknown_image are known policies.
func (c *Config) checkPolicies() error {
	if c.DefaultPool != "" && c.Pool(c.DefaultPool) == nil {
		return c.fail("default_pool", "%q is not one of the [[pool]] names (%s)", c.DefaultPool, strings.Join(c.PoolNames(), ", "))
	}
	if c.DrainedPool != DrainedPoolCold && c.DrainedPool != DrainedPoolWait {
		return c.fail("drained_pool", "%q is not one of cold, wait", c.DrainedPool)
	}
	if c.UnknownImage != UnknownImageReject && c.UnknownImage != UnknownImageCold {
		return c.fail("unknown_image", "%q is not one of reject, cold", c.UnknownImage)
	}
	return nil
}

// checkColdStart checks cold_template and cold_images: both required with unknown_image =
// "cold", neither allowed without it (a forgotten policy switch must not go unnoticed).
func (c *Config) checkColdStart() error {
	if c.UnknownImage != UnknownImageCold {
		switch {
		case c.ColdTemplate != "":
			return c.fail("cold_template", "is only used with unknown_image = \"cold\" (unknown_image is %q)", c.UnknownImage)
		case len(c.ColdImages) > 0:
			return c.fail("cold_images", "is only used with unknown_image = \"cold\" (unknown_image is %q)", c.UnknownImage)
		}
		return nil
	}
	switch {
	case c.ColdTemplate == "":
		return c.fail("cold_template", "is required with unknown_image = \"cold\": the SandboxTemplate cold starts are made from")
	case !isDNSSubdomain(c.ColdTemplate):
		return c.fail("cold_template", "%q is not a valid SandboxTemplate name", c.ColdTemplate)
	case len(c.ColdImages) == 0:
		return c.fail("cold_images", "is required with unknown_image = \"cold\": the image patterns that may be cold-started")
	}
	if bad, ok := badImagePattern(c.ColdImages); ok {
		return c.fail("cold_images", "bad image pattern %q", bad)
	}
	return nil
}

// checkPodLayout: the isolation every job pod must have, and its directories.
func (c *Config) checkPodLayout() error {
	if len(c.RuntimeClasses) == 0 {
		return c.fail("runtime_classes", "must list at least one RuntimeClass (fail-closed isolation)")
	}
	for _, dir := range []struct{ key, value string }{{"builds_dir", c.BuildsDir}, {"cache_dir", c.CacheDir}} {
		if !path.IsAbs(dir.value) {
			return c.fail(dir.key, "%q must be an absolute path inside the job pod", dir.value)
		}
	}
	return nil
}

// checkTimeouts refuses a zero or negative timeout: it would fail every job at once, and leaving
// the key out gives the default.
func (c *Config) checkTimeouts() error {
	for _, d := range []struct {
		key   string
		value time.Duration
	}{{"ready_timeout", c.ReadyTimeout.Duration}, {"claim_grace", c.ClaimGrace.Duration}, {"cleanup_timeout", c.CleanupTimeout.Duration}} {
		if d.value <= 0 {
			return c.fail(d.key, "must be positive, got %s (leave it out for the default)", d.value)
		}
	}
	return nil
}

func (c *Config) checkHelper() error {
	if c.HelperBinary == "" {
		return nil
	}
	if err := checkExecutable(c.HelperBinary); err != nil {
		return c.fail("helper_binary", "%s", err)
	}
	return nil
}

// checkTransport: a known transport, and the network one only with the agent CA.
func (c *Config) checkTransport() error {
	if c.StageTransport != TransportExec && c.StageTransport != TransportNetwork {
		return c.fail("stage_transport", "%q is not one of exec, network", c.StageTransport)
	}
	if (c.AgentCACert == "") != (c.AgentCAKey == "") {
		return c.fail("agent_ca_key", "agent_ca_cert and agent_ca_key go together (sandbox-executor tls init makes both)")
	}
	if c.StageTransport == TransportNetwork && c.AgentCACert == "" {
		return c.fail("stage_transport", "\"network\" needs the agent CA: set agent_ca_cert and agent_ca_key (sandbox-executor tls init makes them; docs/security.md), or use \"exec\"")
	}
	for _, f := range []struct{ key, value string }{{"agent_ca_cert", c.AgentCACert}, {"agent_ca_key", c.AgentCAKey}} {
		if f.value == "" {
			continue
		}
		if _, err := os.Stat(f.value); err != nil {
			return c.fail(f.key, "%v", err)
		}
	}
	return nil
}

// checkReconnects allows zero: a stage that never re-attaches after its stream drops.
func (c *Config) checkReconnects() error {
	if c.Reconnects < 0 {
		return c.fail("reconnects", "must not be negative (0: never re-attach)")
	}
	return nil
}

// checkEgressAdminToken: the token file, when named, is readable and long enough, and the CA
// file, when named, holds certificates.
func (c *Config) checkEgressAdminToken() error {
	if _, err := c.EgressAdminToken(); err != nil {
		return c.fail("egress_admin_token_file", "%v", err)
	}
	if _, err := c.EgressAdminCA(); err != nil {
		return c.fail("egress_admin_ca_file", "%v", err)
	}
	return nil
}

// checkForStageServer: the stage server reads the config in another process, with another
// working directory, so every path in it must be absolute.
func (c *Config) checkForStageServer() error {
	if c.StageServer == "" {
		return nil
	}
	for _, f := range []struct{ key, value string }{
		{"stage_server", c.StageServer}, {"kubeconfig", c.Kubeconfig}, {"agent_ca_cert", c.AgentCACert},
		{"agent_ca_key", c.AgentCAKey}, {"agent_binary", c.AgentBinary}, {"helper_binary", c.HelperBinary},
		{"egress_admin_ca_file", c.EgressAdminCAFile},
	} {
		if f.value != "" && !filepath.IsAbs(f.value) {
			return c.fail(f.key, "%q must be an absolute path with stage_server set (the stage server has its own working directory)", f.value)
		}
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
		return fmt.Errorf("%s: %v", file, failure.WithoutPath(err))
	case !info.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", file)
	case info.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%s is not executable", file)
	}
	return nil
}
