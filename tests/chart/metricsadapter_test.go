package chart_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	certutil "k8s.io/client-go/util/cert"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// The metrics adapter's install: an APIService for external.metrics.k8s.io that reaches its
// Service and pods and trusts its certificate for the name the aggregator checks; the adapter
// serves the release's namespace with exactly kube.ObservePermissions there, plus the grants an
// extension API server needs; the HPA controller may read External metrics.
func TestMetricsAdapter(t *testing.T) {
	const release, ns = "ci", "ci-sandbox"
	name := fullname(release) + "-metrics-adapter"
	objs := helmchart.Render(t, release, ns, "metricsAdapter: {enabled: true}\n")

	var api apiregistrationv1.APIService
	objs.Decode(t, "APIService", "v1beta1.external.metrics.k8s.io", &api)
	if api.Spec.Group != "external.metrics.k8s.io" || api.Spec.Version != "v1beta1" || api.Spec.InsecureSkipTLSVerify {
		t.Errorf("APIService %s/%s insecureSkipTLSVerify %v: want external.metrics.k8s.io/v1beta1, verified", api.Spec.Group, api.Spec.Version, api.Spec.InsecureSkipTLSVerify)
	}
	if s := api.Spec.Service; s == nil || s.Name != name || s.Namespace != ns || s.Port == nil || *s.Port != 443 {
		t.Fatalf("APIService service %+v, want %s/%s port 443", api.Spec.Service, ns, name)
	}
	var svc corev1.Service
	objs.Decode(t, "Service", name, &svc)
	var d appsv1.Deployment
	objs.Decode(t, "Deployment", name, &d)
	pod := d.Spec.Template.Spec
	if !selects(svc.Spec.Selector, d.Spec.Template.Labels) || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 ||
		svc.Spec.Ports[0].TargetPort.StrVal != pod.Containers[0].Ports[0].Name {
		t.Errorf("Service %s (selector %v, ports %+v) does not reach the adapter's pods (labels %v, ports %+v)", name, svc.Spec.Selector, svc.Spec.Ports, d.Spec.Template.Labels, pod.Containers[0].Ports)
	}
	if args := strings.Join(pod.Containers[0].Args, " "); !strings.Contains(args, "--namespace="+ns) {
		t.Errorf("adapter args %q: want --namespace=%s, the release's pools", args, ns)
	}
	if pod.ServiceAccountName != name {
		t.Errorf("adapter pod runs as %q, want its own ServiceAccount %s", pod.ServiceAccountName, name)
	}

	// The certificate the pod serves verifies against the APIService's CA bundle for
	// SERVICE.NAMESPACE.svc, and its key is its own.
	var secret corev1.Secret
	objs.Decode(t, "Secret", name+"-tls", &secret)
	if len(pod.Volumes) != 1 || pod.Volumes[0].Secret == nil || pod.Volumes[0].Secret.SecretName != secret.Name {
		t.Errorf("adapter volumes %+v: want Secret %s", pod.Volumes, secret.Name)
	}
	if _, err := tls.X509KeyPair(secret.Data["tls.crt"], secret.Data["tls.key"]); err != nil {
		t.Errorf("Secret %s: tls.crt and tls.key do not pair: %v", secret.Name, err)
	}
	verifyServing(t, secret.Data["tls.crt"], api.Spec.CABundle, name+"."+ns+".svc")

	// Its own reads, exactly the exporter's.
	role := objs.Find("Role", name)
	if role == nil {
		t.Fatal("no Role " + name)
	}
	var want []string
	for _, p := range kube.ObservePermissions {
		want = append(want, p.String())
	}
	slices.Sort(want)
	if got := helmchart.Grants(role); !slices.Equal(got, want) {
		t.Errorf("Role %s grants %v, want exactly kube.ObservePermissions %v", name, got, want)
	}
	adapterSA := rbacv1.Subject{Kind: "ServiceAccount", Name: name, Namespace: ns}
	for _, b := range []struct{ kind, roleKind, roleName, namespace string }{
		{"RoleBinding", "Role", name, ns},
		{"ClusterRoleBinding", "ClusterRole", "system:auth-delegator", ""},
		{"RoleBinding", "Role", "extension-apiserver-authentication-reader", "kube-system"},
	} {
		if !bound(objs, b.kind, b.namespace, b.roleKind, b.roleName, adapterSA) {
			t.Errorf("no %s in %q binding %s %s to the adapter's ServiceAccount", b.kind, b.namespace, b.roleKind, b.roleName)
		}
	}
	hpa := rbacv1.Subject{Kind: "ServiceAccount", Name: "horizontal-pod-autoscaler", Namespace: "kube-system"}
	reader := ns + "-" + fullname(release) + "-external-metrics-reader"
	readExternal := func(verb string) string {
		return kube.Permission{Group: "external.metrics.k8s.io", Resource: "*", Verb: verb}.String()
	}
	if got := helmchart.Grants(objs.Find("ClusterRole", reader)); !slices.Contains(got, readExternal("get")) || !slices.Contains(got, readExternal("list")) {
		t.Errorf("ClusterRole %s grants %v: want get and list of external.metrics.k8s.io", reader, got)
	}
	if !bound(objs, "ClusterRoleBinding", "", "ClusterRole", reader, hpa) {
		t.Errorf("no ClusterRoleBinding of %s to the HPA controller", reader)
	}
}

// A certificate of the user's own: the chart makes none and trusts the CA given.
func TestMetricsAdapterWithItsOwnCertificate(t *testing.T) {
	caPEM, _, err := certutil.GenerateSelfSignedCertKey("ci-ca", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	values := "metricsAdapter:\n  enabled: true\n  tls:\n    existingSecret: adapter-cert\n    caBundle: |\n" + indent(string(caPEM), "      ")
	objs := helmchart.Render(t, "ci", "ci-sandbox", values)
	if s := objs.Find("Secret", "ci-sandbox-executor-metrics-adapter-tls"); s != nil {
		t.Error("the chart made a certificate although one was given")
	}
	var api apiregistrationv1.APIService
	objs.Decode(t, "APIService", "v1beta1.external.metrics.k8s.io", &api)
	if string(api.Spec.CABundle) != string(caPEM) {
		t.Errorf("APIService caBundle is not the CA given")
	}
	var d appsv1.Deployment
	objs.Decode(t, "Deployment", "ci-sandbox-executor-metrics-adapter", &d)
	if v := d.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].Secret == nil || v[0].Secret.SecretName != "adapter-cert" {
		t.Errorf("adapter volumes %+v: want Secret adapter-cert", v)
	}

	_, err = helmchart.Template(t, "ci", "ci-sandbox", "metricsAdapter: {enabled: true, tls: {existingSecret: adapter-cert}}\n")
	if err == nil || !strings.Contains(err.Error(), "metricsAdapter.tls.caBundle is required with metricsAdapter.tls.existingSecret") {
		t.Errorf("existingSecret without caBundle: want a one-line refusal, got %v", err)
	}
	if objs := helmchart.Render(t, "ci", "ci-sandbox", ""); objs.Find("APIService", "v1beta1.external.metrics.k8s.io") != nil {
		t.Error("the adapter is on by default: the cluster's one External metrics API is the user's choice")
	}
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return prefix + strings.Join(lines, "\n"+prefix) + "\n"
}

// verifyServing checks that the first certificate of certPEM is valid for host under the CAs
// of bundle.
func verifyServing(t *testing.T, certPEM, bundle []byte, host string) {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatalf("APIService caBundle holds no certificate: %q", base64.StdEncoding.EncodeToString(bundle))
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err != nil {
		t.Errorf("the adapter's certificate does not verify for %s against the APIService's CA bundle: %v", host, err)
	}
}

// bound reports whether a binding of kind in namespace binds roleKind/roleName to subject.
func bound(objs *helmchart.Objects, kind, namespace, roleKind, roleName string, subject rbacv1.Subject) bool {
	for _, u := range objs.OfKind(kind) {
		if u.GetNamespace() != namespace {
			continue
		}
		var b rbacv1.RoleBinding
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &b); err != nil {
			continue
		}
		if b.RoleRef.Kind == roleKind && b.RoleRef.Name == roleName && slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == subject.Kind && s.Name == subject.Name && s.Namespace == subject.Namespace
		}) {
			return true
		}
	}
	return false
}
