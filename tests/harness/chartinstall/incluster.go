// Package chartinstall installs sandbox-executor on the local cluster as a user does: the chart
// (deploy/chart/sandbox-executor) with the project's images (make images), the runner
// (gitlab-runner 17.9 in the runner image) in a pod with its ServiceAccount's credentials,
// GitLab reached by a cluster DNS name. The e2e suite (TestInClusterInstall) and the demo use it.
package chartinstall

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// RunnerName is the executor's runner_name in the release: claims are labelled with it and gc
// reaps its claims.
const RunnerName = "incluster-runner"

// TestNamespaceLabel marks the namespaces a test makes (value: the release or test that made
// them): a suite deletes its own when it ends; tests/cluster/up.sh deletes those a killed run
// left, whose warm pools would otherwise keep gVisor pods running under every later suite.
const TestNamespaceLabel = "sandbox-executor.gitlab.io/test"

// Options say where to install and what GitLab to register with.
type Options struct {
	// Root is the module root (the chart and dist/images are under it).
	Root string
	// Env is the local cluster (kubectl, admin kubeconfig).
	Env *localcluster.Env
	// Kube is an admin client of the cluster.
	Kube kubernetes.Interface
	// Namespace is the release's; GitLabNamespace holds the Service that names the instance.
	Namespace, GitLabNamespace string
	// Release is the Helm release name.
	Release string
	// InstanceIP is the GitLab instance's address (port 80) on the instance network, and
	// RunnerToken the runner authentication token it accepts.
	InstanceIP, RunnerToken string
	// JobImage is the image of the release's one template and pool.
	JobImage string
	// InstanceCA, when set, is the CA (PEM) of an instance served over HTTPS on port 443, as
	// a self-managed instance with an internal CA; else the instance serves HTTP on port 80.
	InstanceCA []byte
	// ExtraValues, when set, are values (YAML) given to helm after the release's own, as an
	// admin's second -f file: they override it (a list, such as templates, as a whole).
	ExtraValues string
}

// Release is an installed release; Uninstall it, then Close.
type Release struct {
	Options
	// Helm is the pinned helm binary (make helm-path).
	Helm string
	// GitLabURL is the instance's URL as the runner sees it: a cluster DNS name.
	GitLabURL string
	// Tag is the images' tag (make images).
	Tag string

	uninstalled bool
	// serviceIP is the instance's Service's ClusterIP: jobs dial it by name, and the netstack
	// fence, inside the pod, sees it before kube-proxy translates it (gitlab.cidrs lists it).
	serviceIP string
}

// builtImages is dist/images/images.json as tools/images writes it.
type builtImages struct {
	Tag    string `json:"tag"`
	Images []struct {
		Name string `json:"name"`
		Ref  string `json:"ref"`
	} `json:"images"`
}

// ImagesTag reads what make images built and imported; the runner image must be among them.
func ImagesTag(root string) (string, error) {
	path := filepath.Join(root, "dist", "images", "images.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: run `make images` first (it builds the images and imports them into the local cluster)", err)
	}
	var m builtImages
	if err := json.Unmarshal(data, &m); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	for _, img := range m.Images {
		if img.Name == "sandbox-executor-runner" {
			return m.Tag, nil
		}
	}
	return "", fmt.Errorf("%s has no sandbox-executor-runner image (tools/images skips it without the runner binaries)", path)
}

// TagImages gives every image make images imported (dist/images/images.json) a second tag in the
// local cluster's containerd, pinned as tests/cluster/images.sh pins what it imports: the same
// bytes under another reference, for a test that upgrades a release to "new" images (the changed
// reference is what rolls the pods). untag removes those tags, never the images' own.
func TagImages(root string, env *localcluster.Env, tag string) (untag func() error, err error) {
	path := filepath.Join(root, "dist", "images", "images.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m builtImages
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ctr := func(args ...string) (string, error) {
		return Run(filepath.Join(env.Dir, "bin", "ctr"), append([]string{"--address", filepath.Join(env.Dir, "run", "containerd.sock"), "--namespace", "k8s.io"}, args...)...)
	}
	var tagged []string
	untag = func() error {
		if len(tagged) == 0 {
			return nil
		}
		_, err := ctr(append([]string{"images", "rm"}, tagged...)...)
		return err
	}
	for _, img := range m.Images {
		repo, _, ok := strings.Cut(img.Ref, ":"+m.Tag)
		if !ok || repo+":"+m.Tag != img.Ref {
			return untag, fmt.Errorf("%s: image %s is not tagged %s", path, img.Ref, m.Tag)
		}
		ref := repo + ":" + tag
		if _, err := ctr("images", "tag", "--force", img.Ref, ref); err != nil {
			return untag, err
		}
		tagged = append(tagged, ref)
		if _, err := ctr("images", "label", ref, "io.cri-containerd.pinned=pinned"); err != nil {
			return untag, err
		}
	}
	return untag, nil
}

// helmBuild serialises Helm: tests of one process run in parallel, and two makes building the
// missing helm at once would race on its install directory.
var helmBuild sync.Mutex

// Helm is the pinned helm binary (make helm-path builds it if needed).
func Helm(root string) (string, error) {
	helmBuild.Lock()
	defer helmBuild.Unlock()
	out, err := Run("make", "-s", "--no-print-directory", "-C", root, "helm-path")
	return strings.TrimSpace(out), err
}

// Run runs a command of the install (helm, kubectl) and returns its output; a failure carries it.
func Run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Output runs a command like Run but returns its stdout and stderr apart, for output that is
// parsed: a command that succeeds may still warn on stderr (kubectl, of an API group it could not
// discover). A failure carries both.
func Output(name string, args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), errOut.String(), fmt.Errorf("%s %s: %w\n%s%s", filepath.Base(name), strings.Join(args, " "), err, &out, &errOut)
	}
	return out.String(), errOut.String(), nil
}

// Install exposes the instance by name, makes the release namespace (helm cannot install into a
// namespace its own chart creates), installs the chart and creates the runner token Secret.
func Install(ctx context.Context, o Options) (*Release, error) {
	tag, err := ImagesTag(o.Root)
	if err != nil {
		return nil, err
	}
	helm, err := Helm(o.Root)
	if err != nil {
		return nil, err
	}
	r := &Release{Options: o, Helm: helm, Tag: tag}
	if r.GitLabURL, err = r.exposeInstance(ctx); err != nil {
		return r, err
	}
	// As an operator would make it, with the Pod Security labels the chart would give it
	// (namespace.podSecurity: the netstack fence's init container adds NET_ADMIN in the sandbox).
	if _, err := o.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/warn": "baseline",
		TestNamespaceLabel: o.Release}}}, metav1.CreateOptions{}); err != nil {
		return r, err
	}
	if err := r.installAgentCA(ctx); err != nil {
		return r, err
	}
	dir, err := os.MkdirTemp("", "incluster-values")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	values := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(values, []byte(r.values()), 0o600); err != nil {
		return r, err
	}
	args := []string{"install", o.Release, filepath.Join(o.Root, "deploy", "chart", "sandbox-executor"), "-n", o.Namespace, "-f", values}
	if o.ExtraValues != "" {
		extra := filepath.Join(dir, "extra-values.yaml")
		if err := os.WriteFile(extra, []byte(o.ExtraValues), 0o600); err != nil {
			return r, err
		}
		args = append(args, "-f", extra)
	}
	if _, err := Run(r.Helm, append(args, r.kubeconfigFlag())...); err != nil {
		return r, err
	}
	// Where the runner chart keeps it (Secret key runner-token); the runner pod waits for it.
	_, err = o.Kube.CoreV1().Secrets(o.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "gitlab-runner-token"},
		StringData: map[string]string{"runner-token": o.RunnerToken},
	}, metav1.CreateOptions{})
	return r, err
}

// installAgentCA makes an agent CA as `sandbox-executor tls init` does and installs it as its
// instructions say: the ConfigMap the job pods trust, the TLS Secret only the runner mounts.
func (r *Release) installAgentCA(ctx context.Context) error {
	certPEM, keyPEM, err := agentca.Generate("incluster agent CA", 24*time.Hour)
	if err != nil {
		return err
	}
	if _, err := r.Kube.CoreV1().ConfigMaps(r.Namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: agentCAName},
		Data:       map[string]string{"ca.crt": string(certPEM)},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err = r.Kube.CoreV1().Secrets(r.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: agentCAName},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
	}, metav1.CreateOptions{})
	return err
}

// agentCAName is the ConfigMap and Secret of the agent CA, as the chart's agentTLS.name has it.
const agentCAName = "sandbox-executor-agent-ca"

func (r *Release) kubeconfigFlag() string { return "--kubeconfig=" + r.Env.AdminKubeconfig() }

// Kubectl runs the cluster's kubectl as admin.
func (r *Release) Kubectl(args ...string) (string, error) {
	return Run(r.kubectl(), append([]string{r.kubeconfigFlag()}, args...)...)
}

// KubectlOutput is Kubectl with stdout and stderr apart (Output).
func (r *Release) KubectlOutput(args ...string) (stdout, stderr string, err error) {
	return Output(r.kubectl(), append([]string{r.kubeconfigFlag()}, args...)...)
}

// KubectlCommand is the cluster's kubectl as admin, to start: for a command that runs while the
// caller goes on (a drain).
func (r *Release) KubectlCommand(args ...string) *exec.Cmd {
	return exec.Command(r.kubectl(), append([]string{r.kubeconfigFlag()}, args...)...)
}

func (r *Release) kubectl() string { return filepath.Join(r.Env.Dir, "bin", "kubectl") }

// Fullname is the chart's name for the release's objects (sandbox-executor.fullname).
func (r *Release) Fullname() string {
	if strings.Contains(r.Release, "sandbox-executor") {
		return r.Release
	}
	return r.Release + "-sandbox-executor"
}

// RunnerLog is the end of the runner pod's log, for failure messages.
func (r *Release) RunnerLog() string { return r.runnerLog(80) }

// WholeRunnerLog is the runner pod's whole log.
func (r *Release) WholeRunnerLog() string { return r.runnerLog(-1) }

func (r *Release) runnerLog(tail int) string {
	out, _ := r.Kubectl("-n", r.Namespace, "logs", "deploy/"+r.Fullname()+"-runner", "--tail="+strconv.Itoa(tail))
	return out
}

// Uninstall removes the release and waits for its objects to go.
func (r *Release) Uninstall() error {
	_, err := Run(r.Helm, "uninstall", r.Release, "-n", r.Namespace, "--wait", "--timeout", "3m", r.kubeconfigFlag())
	r.uninstalled = r.uninstalled || err == nil
	return err
}

// Uninstalled says whether Uninstall succeeded.
func (r *Release) Uninstalled() bool { return r.uninstalled }

// Close deletes the namespaces Install made (after Uninstall, the release's is empty).
func (r *Release) Close() error {
	var errs []error
	for _, ns := range []string{r.Namespace, r.GitLabNamespace} {
		if err := r.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// values are the release's chart values: its own RuntimeClass (a cluster-scoped object
// uninstall must remove), GitLab at a cluster DNS name, the job pods allowed to reach the
// instance's address, the runner on, gc on a schedule that never fires (a test triggers it).
func (r *Release) values() string {
	return fmt.Sprintf(`namespace:
  create: false
images:
  repository: sandbox-executor.local
  tag: %[1]q
  pullPolicy: Never
runtimeClass:
  create: true
  handler: runsc
gitlab:
  url: %[2]s
  cidrs: ["%[3]s/32", "%[6]s/32"]
  ports: [80]
jobDefaults:
  fence:
    deny: ["10.99.0.2:80"]
    allow: ["%[3]s:80"]
  resources:
    requests: {cpu: 50m, memory: 256Mi, ephemeral-storage: 1Gi}
    limits: {cpu: "2", memory: 2Gi, ephemeral-storage: 4Gi}
templates:
  - name: duo-gvisor
    image: %[4]s
    egress: direct
pools:
  - name: duo-default
    template: duo-gvisor
    replicas: 2
    images: ["%[4]s"]
executor:
  runnerName: %[5]s
  defaultPool: duo-default
  stageTransport: network
agentTLS:
  enabled: true
runner:
  enabled: true
  secret: gitlab-runner-token
  checkInterval: 1
  resources:
    requests: {cpu: 50m, memory: 64Mi}
    limits: {cpu: "1", memory: 512Mi}
gc:
  enabled: true
  schedule: "0 0 1 1 *"
`, r.Tag, r.GitLabURL, r.InstanceIP, r.JobImage, RunnerName, r.serviceIP)
}

// InstanceName is the instance's cluster DNS name for GitLab's namespace: a certificate of an
// HTTPS instance must name it.
func InstanceName(gitlabNamespace string) string {
	return "gitlab." + gitlabNamespace + ".svc.cluster.local"
}

// exposeInstance makes the instance (port 80, or 443 with InstanceCA) reachable as
// InstanceName, as for any GitLab outside the cluster: a Service without selector and an
// EndpointSlice with the instance's address. Returns the URL.
func (r *Release) exposeInstance(ctx context.Context) (string, error) {
	ns := r.GitLabNamespace
	if _, err := r.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{TestNamespaceLabel: r.Release}}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	scheme, port := "http", int32(80)
	if r.InstanceCA != nil {
		scheme, port = "https", 443
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "gitlab"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: scheme, Port: port, Protocol: corev1.ProtocolTCP}}},
	}
	created, err := r.Kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	r.serviceIP = created.Spec.ClusterIP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "gitlab-instance", Labels: map[string]string{
			discoveryv1.LabelServiceName: "gitlab", discoveryv1.LabelManagedBy: "sandbox-executor-incluster"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(scheme), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{r.InstanceIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	if _, err := r.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	return scheme + "://" + InstanceName(ns), nil
}
