package chart_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
)

const proxiedValues = `
templates:
  - {name: duo-gvisor, image: "registry.example.com/duo/ci:bookworm", egress: proxied}
`

// The egress proxy's admin API is served over TLS and the runners verify it: the chart makes a
// certificate for the proxy's Service name (Secret <fullname>-egress-admin-tls), mounts its key
// in the proxy only and its CA in the runners only, and the executor's config reaches the proxy
// at https:// with egress_admin_ca_file. The rendered certificate, the proxy's rendered config and
// the executor's rendered config work together: a grant goes through over TLS 1.3, with the
// Service's name as the server name.
func TestEgressAdminIsServedOverTLS(t *testing.T) {
	objs := helmchart.Render(t, "duo", "duo-ci", proxiedValues)
	const secretName = "duo-sandbox-executor-egress-admin-tls"
	const host = "duo-sandbox-executor-egress-proxy.duo-ci.svc"
	var secret corev1.Secret
	objs.Decode(t, "Secret", secretName, &secret)
	if secret.Type != corev1.SecretTypeTLS || len(secret.Data["tls.crt"]) == 0 || len(secret.Data["tls.key"]) == 0 || len(secret.Data["ca.crt"]) == 0 {
		t.Fatalf("Secret %s: type %s, keys %v; want a TLS Secret with tls.crt, tls.key and ca.crt", secretName, secret.Type, keys(secret.Data))
	}

	// The proxy mounts the certificate and key (not the CA's key: the chart keeps none), serves
	// TLS on the admin port and probes it over HTTPS.
	var proxy appsv1.Deployment
	objs.Decode(t, "Deployment", "duo-sandbox-executor-egress-proxy", &proxy)
	pc := proxy.Spec.Template.Spec.Containers[0]
	if !mountsSecretItems(proxy.Spec.Template.Spec, pc, secretName, "/etc/sandbox-egress-proxy-tls", "tls.crt", "tls.key") {
		t.Errorf("the proxy does not mount tls.crt and tls.key of %s at /etc/sandbox-egress-proxy-tls: %+v", secretName, proxy.Spec.Template.Spec.Volumes)
	}
	for name, probe := range map[string]*corev1.Probe{"readiness": pc.ReadinessProbe, "liveness": pc.LivenessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("the proxy's %s probe is not HTTPS: %+v", name, probe)
		}
	}
	dir := t.TempDir()
	for key, file := range map[string]string{"tls.crt": "tls.crt", "tls.key": "tls.key", "ca.crt": "ca.crt"} {
		if err := os.WriteFile(filepath.Join(dir, file), secret.Data[key], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	built, err := loadEgressConfig(t, objs, "duo-sandbox-executor-egress-proxy", map[string]string{
		"/etc/sandbox-egress-proxy-tls/tls.crt": filepath.Join(dir, "tls.crt"),
		"/etc/sandbox-egress-proxy-tls/tls.key": filepath.Join(dir, "tls.key"),
	})
	if err != nil {
		t.Fatalf("the proxy's config does not load: %v", err)
	}
	if built.AdminTLS == nil {
		t.Fatal("the proxy's config serves the admin API without TLS")
	}

	// The runners mount the CA, never the key, and their config names it, at https://.
	var runner appsv1.Deployment
	objs.Decode(t, "Deployment", "duo-sandbox-executor-runner", &runner)
	for _, v := range runner.Spec.Template.Spec.Volumes {
		for _, src := range projectedSecrets(v) {
			if src.Name == secretName && slices.ContainsFunc(src.Items, func(i corev1.KeyToPath) bool { return i.Key != "ca.crt" }) {
				t.Errorf("the runner mounts more than ca.crt of %s: %+v", secretName, src.Items)
			}
		}
		if v.Secret != nil && v.Secret.SecretName == secretName {
			t.Errorf("the runner mounts the whole Secret %s (its key too)", secretName)
		}
	}
	if !slices.ContainsFunc(runner.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return slices.ContainsFunc(projectedSecrets(v), func(s corev1.SecretProjection) bool {
			return s.Name == secretName && slices.Equal(s.Items, []corev1.KeyToPath{{Key: "ca.crt", Path: "egress-admin/ca.crt"}})
		})
	}) {
		t.Errorf("the runner does not mount ca.crt of %s at egress-admin/ca.crt of its config volume", secretName)
	}
	var cm corev1.ConfigMap
	objs.Decode(t, "ConfigMap", "duo-sandbox-executor-config", &cm)
	text := strings.ReplaceAll(cm.Data["config.toml"], "/etc/sandbox-executor/egress-admin/ca.crt", filepath.Join(dir, "ca.crt"))
	text = strings.ReplaceAll(text, egressAdminToken, writeToken(t, dir))
	// The runner image's files and the agent CA's are not here: what this test checks does not
	// need them.
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if !slices.ContainsFunc([]string{"agent_binary", "helper_binary", "agent_ca_", "stage_transport", "stage_server"}, func(k string) bool { return strings.HasPrefix(l, k) }) {
			lines = append(lines, l)
		}
	}
	text = strings.Join(lines, "\n")
	cfg, err := config.Parse("config.toml", []byte(text))
	if err != nil {
		t.Fatalf("the executor's config does not load: %v\n%s", err, text)
	}
	pool := cfg.Pool("duo-default") // the default pool, on the proxied template
	if pool == nil || pool.EgressProxy != "https://"+host+":3129" || cfg.EgressAdminCAFile != filepath.Join(dir, "ca.crt") {
		t.Fatalf("executor config: pool %+v, egress_admin_ca_file %q; want https://%s:3129 and the CA", pool, cfg.EgressAdminCAFile, host)
	}

	// Together: the runner's client, with the config's CA and token, grants through the proxy
	// served with the rendered certificate, reached by the Service's name, over TLS 1.3.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: &egress.Admin{Recorder: &egress.Recorder{}, Grants: &egress.Grants{}, Allow: built.Allow, Token: built.Token}}
	go func() { _ = srv.Serve(tls.NewListener(ln, built.AdminTLS)) }()
	defer srv.Close()
	ca, err := cfg.EgressAdminCA()
	if err != nil {
		t.Fatal(err)
	}
	token, err := cfg.EgressAdminToken()
	if err != nil {
		t.Fatal(err)
	}
	hc := adminclient.HTTPClient(ca)
	var version uint16
	hc.Transport.(*http.Transport).DialTLSContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		// The Service's name, at this test's listener.
		conn, err := (&tls.Dialer{Config: &tls.Config{RootCAs: ca, ServerName: host, MinVersion: tls.VersionTLS12}}).DialContext(ctx, network, ln.Addr().String())
		if err == nil {
			version = conn.(*tls.Conn).ConnectionState().Version
		}
		return conn, err
	}
	client := &adminclient.Client{Base: pool.EgressProxy, Token: token, HTTP: hc}
	if err := client.PutGrant(context.Background(), "10.88.0.5", adminclient.Grant{Allow: []string{"x.example"}, Until: time.Now().Add(time.Hour)}); err != nil {
		t.Fatalf("a grant over the rendered TLS: %v", err)
	}
	if version != tls.VersionTLS13 {
		t.Errorf("negotiated %s, want TLS 1.3", tls.VersionName(version))
	}
	// Another release's CA does not verify this proxy.
	other := helmchart.Render(t, "other", "duo-ci", proxiedValues)
	var otherSecret corev1.Secret
	other.Decode(t, "Secret", "other-sandbox-executor-egress-admin-tls", &otherSecret)
	otherCA := x509.NewCertPool()
	otherCA.AppendCertsFromPEM(otherSecret.Data["ca.crt"])
	if _, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: otherCA, ServerName: host}); err == nil {
		t.Error("another release's CA verifies this proxy's certificate")
	}
}

// An existing Secret (cert-manager's, say) replaces the chart's: the chart makes none, and the
// proxy and runners mount the one named.
func TestEgressAdminTLSExistingSecret(t *testing.T) {
	objs := helmchart.Render(t, "duo", "duo-ci", proxiedValues+"egressProxy: {adminTLS: {existingSecret: proxy-admin-cert}}\n")
	if objs.Find("Secret", "duo-sandbox-executor-egress-admin-tls") != nil {
		t.Error("the chart made its own admin TLS Secret although one was named")
	}
	var proxy, runner appsv1.Deployment
	objs.Decode(t, "Deployment", "duo-sandbox-executor-egress-proxy", &proxy)
	objs.Decode(t, "Deployment", "duo-sandbox-executor-runner", &runner)
	if !mountsSecretItems(proxy.Spec.Template.Spec, proxy.Spec.Template.Spec.Containers[0], "proxy-admin-cert", "/etc/sandbox-egress-proxy-tls", "tls.crt", "tls.key") {
		t.Errorf("the proxy does not mount Secret proxy-admin-cert")
	}
	if !slices.ContainsFunc(runner.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return slices.ContainsFunc(projectedSecrets(v), func(s corev1.SecretProjection) bool { return s.Name == "proxy-admin-cert" })
	}) {
		t.Errorf("the runner does not mount ca.crt of Secret proxy-admin-cert")
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func projectedSecrets(v corev1.Volume) []corev1.SecretProjection {
	var out []corev1.SecretProjection
	if v.Projected != nil {
		for _, s := range v.Projected.Sources {
			if s.Secret != nil {
				out = append(out, *s.Secret)
			}
		}
	}
	return out
}

// mountsSecretItems tells whether container c of pod mounts at path a volume of exactly items of
// Secret secret.
func mountsSecretItems(pod corev1.PodSpec, c corev1.Container, secret, path string, items ...string) bool {
	for _, v := range pod.Volumes {
		if v.Secret == nil || v.Secret.SecretName != secret {
			continue
		}
		var got []string
		for _, i := range v.Secret.Items {
			got = append(got, i.Key)
		}
		if !slices.Equal(got, items) {
			return false
		}
		return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name && m.MountPath == path && m.ReadOnly })
	}
	return false
}

func writeToken(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "token")
	if err := os.WriteFile(p, []byte("a-token-of-at-least-16-characters"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// renderedAdminTLS writes the rendered admin TLS Secret's certificate and key into dir and
// returns their paths in the proxy's pod mapped to those files.
func renderedAdminTLS(t *testing.T, objs *helmchart.Objects, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	for _, u := range objs.OfKind("Secret") {
		if !strings.HasSuffix(u.GetName(), "-egress-admin-tls") {
			continue
		}
		var secret corev1.Secret
		objs.Decode(t, "Secret", u.GetName(), &secret)
		for _, key := range []string{"tls.crt", "tls.key"} {
			p := filepath.Join(dir, key)
			if err := os.WriteFile(p, secret.Data[key], 0o600); err != nil {
				t.Fatal(err)
			}
			files["/etc/sandbox-egress-proxy-tls/"+key] = p
		}
	}
	return files
}
