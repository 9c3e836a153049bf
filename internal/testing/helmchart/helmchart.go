// Package helmchart renders the Helm chart (deploy/chart/sandbox-executor) with `helm template`
// for unit tests: the objects a user installs, decoded, so tests assert on what ships.
package helmchart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// HelmEnv names the helm binary; make unit sets it to the pinned helm it installs.
const HelmEnv = "SANDBOX_EXECUTOR_HELM"

// Chart is the chart's directory.
func Chart(t testing.TB) string {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "chart", "sandbox-executor")
}

// Helm is the helm binary from $SANDBOX_EXECUTOR_HELM.
func Helm(t testing.TB) string {
	t.Helper()
	helm := os.Getenv(HelmEnv)
	if helm == "" {
		t.Fatalf("%s is not set: run `make unit` (it installs the pinned helm), or point it at a helm 3 binary", HelmEnv)
	}
	return helm
}

// Objects is a rendered release.
type Objects struct {
	Items []unstructured.Unstructured
}

// Render runs helm template for release in namespace with the values (YAML, may be empty) and
// fails the test if it does not render.
func Render(t testing.TB, release, namespace, values string) *Objects {
	t.Helper()
	out, err := Template(t, release, namespace, values)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	objs, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// Parse decodes what helm template printed.
func Parse(manifests []byte) (*Objects, error) {
	objs := &Objects{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decoding helm template's output: %w", err)
		}
		if len(u.Object) > 0 {
			objs.Items = append(objs.Items, u)
		}
	}
}

// Template runs helm template (with extra flags, if any) and returns its output, or an error
// with helm's message.
func Template(t testing.TB, release, namespace, values string, flags ...string) ([]byte, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	args := append([]string{"template", release, Chart(t), "--namespace", namespace, "-f", file}, flags...)
	cmd := exec.Command(Helm(t), args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.New(strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Find returns the object of kind and name, or nil.
func (o *Objects) Find(kind, name string) *unstructured.Unstructured {
	for i := range o.Items {
		if o.Items[i].GetKind() == kind && o.Items[i].GetName() == name {
			return &o.Items[i]
		}
	}
	return nil
}

// OfKind lists the objects of kind.
func (o *Objects) OfKind(kind string) []unstructured.Unstructured {
	var out []unstructured.Unstructured
	for _, u := range o.Items {
		if u.GetKind() == kind {
			out = append(out, u)
		}
	}
	return out
}

// Decode finds kind/name and converts it into a typed object; it fails the test if there is none.
func (o *Objects) Decode(t testing.TB, kind, name string, into any) {
	t.Helper()
	u := o.Find(kind, name)
	if u == nil {
		var names []string
		for _, it := range o.Items {
			names = append(names, it.GetKind()+"/"+it.GetName())
		}
		t.Fatalf("the chart renders no %s %q; it renders %s", kind, name, strings.Join(names, ", "))
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
}

// Grants lists what a rendered Role or ClusterRole allows, one "group/resource verb" per
// apiGroup, resource and verb of its rules, sorted (kube.Permission's form).
func Grants(role *unstructured.Unstructured) []string {
	var out []string
	rules, _ := role.Object["rules"].([]any)
	for _, r := range rules {
		rule, _ := r.(map[string]any)
		groups, _ := rule["apiGroups"].([]any)
		resources, _ := rule["resources"].([]any)
		verbs, _ := rule["verbs"].([]any)
		for _, g := range groups {
			for _, res := range resources {
				for _, v := range verbs {
					out = append(out, kube.Permission{Group: g.(string), Resource: res.(string), Verb: v.(string)}.String())
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// Notes renders the chart's NOTES.txt, what helm install prints, for the values. helm template
// skips NOTES.txt, so it renders a copy of the chart in which the notes are a named template and
// a ConfigMap carries their text.
func Notes(t testing.TB, release, namespace, values string) string {
	t.Helper()
	chart := filepath.Join(t.TempDir(), "sandbox-executor")
	if err := os.CopyFS(chart, os.DirFS(Chart(t))); err != nil {
		t.Fatal(err)
	}
	templates := filepath.Join(chart, "templates")
	notes, err := os.ReadFile(filepath.Join(templates, "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"NOTES.txt":  "",
		"_notes.tpl": `{{- define "helmchart.notes" -}}` + string(notes) + `{{- end -}}`,
		"notes.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: helmchart-notes}\ndata:\n  notes: {{ include \"helmchart.notes\" . | toJson }}\n",
	} {
		if err := os.WriteFile(filepath.Join(templates, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(Helm(t), "template", release, chart, "--namespace", namespace, "-f", file, "--show-only", "templates/notes.yaml")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template of NOTES.txt: %s", strings.TrimSpace(stderr.String()))
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := utilyaml.Unmarshal(out, &cm); err != nil {
		t.Fatalf("the rendered NOTES.txt: %v", err)
	}
	return cm.Data["notes"]
}
