package chart_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/quickstart"
)

// TestQuickstartsRender runs the quickstarts of the README and docs/install.md as far as they go
// without a cluster, verbatim (no placeholder is replaced: the docs' example values must render
// too): in a directory with the chart packaged as `make release` names it and the quickstart's
// files, `tar` runs, every `helm install` is rendered with `helm template` and the same
// arguments (a renamed value is refused by the schema), and every object a `kubectl` command
// names (deploy/NAME, a ServiceAccount's token) must be in that rendering. A command this test
// does not know fails it, so a new step in the docs is checked or noticed.
func TestQuickstartsRender(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	qs, err := quickstart.Read(root, quickstart.Docs...)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range quickstart.Names {
		q := qs[name]
		if q == nil {
			t.Errorf("no quickstart %q in %s (mark its blocks <!-- quickstart: %s -->)", name, strings.Join(quickstart.Docs, ", "), name)
			continue
		}
		t.Run(name, func(t *testing.T) { renderQuickstart(t, q) })
	}
}

func renderQuickstart(t *testing.T, q *quickstart.Quickstart) {
	dir := t.TempDir()
	helm := helmchart.Helm(t)
	run := func(name string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s (%s): %s %s: %v\n%s", q.Name, strings.Join(q.Sources, ", "), filepath.Base(name), strings.Join(args, " "), err, out)
		}
		return out
	}
	run(helm, "package", helmchart.Chart(t), "--destination", dir)
	if err := q.WriteFiles(dir, nil); err != nil {
		t.Fatal(err)
	}
	argv, err := q.Argv(nil)
	if err != nil {
		t.Fatal(err)
	}
	var namespaces []string
	var rendered *helmchart.Objects
	var installArgs []string
	namespaceLabels := map[string]string{} // what kubectl label namespace sets
	var references [][2]string             // kind, name: what kubectl commands name
	for _, args := range argv {
		switch {
		case args[0] == "tar":
			run("tar", args[1:]...)
		case args[0] == "helm" && len(args) > 1 && args[1] == "install":
			installArgs = args[2:]
			out := run(helm, append([]string{"template"}, installArgs...)...)
			if rendered, err = helmchart.Parse(out); err != nil {
				t.Fatal(err)
			}
			namespaces = append(namespaces, flagValue(args, "--namespace", "-n"))
		case args[0] == "helm" && len(args) > 1 && args[1] == "uninstall":
			namespaces = append(namespaces, flagValue(args, "--namespace", "-n"))
		case args[0] == "kubectl":
			references = append(references, kubectlReferences(t, args)...)
			if len(args) > 3 && (args[1] == "create" || args[1] == "label") && args[2] == "namespace" {
				namespaces = append(namespaces, args[3])
				if args[1] == "label" {
					for _, label := range args[4:] {
						k, v, _ := strings.Cut(label, "=")
						namespaceLabels[k] = v
					}
				}
			} else {
				namespaces = append(namespaces, flagValue(args, "--namespace", "-n"))
			}
		default:
			t.Errorf("quickstart %s: this test does not know how to check %q: teach it", q.Name, strings.Join(args, " "))
		}
	}
	if rendered == nil {
		t.Fatalf("quickstart %s (%s) has no helm install", q.Name, strings.Join(q.Sources, ", "))
	}
	slices.Sort(namespaces)
	if namespaces = slices.Compact(namespaces); len(namespaces) != 1 || namespaces[0] == "" {
		t.Errorf("quickstart %s uses namespaces %q, want one, named in every command", q.Name, namespaces)
	}
	// The namespace's Pod Security labels are those the chart gives a namespace it renders
	// (namespace.podSecurity): any other level refuses the job pods the chart makes, or is
	// looser than it needs.
	var ns corev1.Namespace
	withNamespace, err := helmchart.Parse(run(helm, append([]string{"template"}, append(installArgs, "--set", "namespace.create=true")...)...))
	if err != nil {
		t.Fatal(err)
	}
	if len(withNamespace.OfKind("Namespace")) != 1 {
		t.Fatalf("helm template with namespace.create=true rendered no Namespace")
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(withNamespace.OfKind("Namespace")[0].Object, &ns); err != nil {
		t.Fatal(err)
	}
	for k, v := range ns.Labels {
		if strings.HasPrefix(k, "pod-security.kubernetes.io/") && namespaceLabels[k] != v {
			t.Errorf("quickstart %s labels the namespace %s=%q, the chart %q", q.Name, k, namespaceLabels[k], v)
		}
	}
	for _, ref := range references {
		if rendered.Find(ref[0], ref[1]) == nil {
			t.Errorf("quickstart %s names %s %s, which the chart does not install", q.Name, ref[0], ref[1])
		}
	}
}

// flagValue is the value of the flag (any of its names) in args, or "".
func flagValue(args []string, names ...string) string {
	for i, a := range args {
		for _, name := range names {
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
	}
	return ""
}

// kubectlReferences are the chart's objects a kubectl command of the quickstarts names.
func kubectlReferences(t *testing.T, args []string) [][2]string {
	t.Helper()
	var refs [][2]string
	for i, a := range args {
		if name, ok := strings.CutPrefix(a, "deploy/"); ok {
			refs = append(refs, [2]string{"Deployment", name})
		}
		if i >= 2 && args[i-2] == "create" && args[i-1] == "token" || i >= 2 && args[i-2] == "get" && args[i-1] == "serviceaccount" {
			refs = append(refs, [2]string{"ServiceAccount", a})
		}
	}
	return refs
}

// TestSiteValuesHaveTheDocumentedShape: the site values file TestDocumentedInstall installs has
// every key of the one docs/install.md shows, so the e2e test installs what the docs say.
func TestSiteValuesHaveTheDocumentedShape(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	qs, err := quickstart.Read(root, quickstart.Docs...)
	if err != nil {
		t.Fatal(err)
	}
	documented, ok := qs[quickstart.DuoFlow].Files["site-values.yaml"]
	if !ok {
		t.Fatalf("docs/install.md has no <!-- quickstart: %s file=site-values.yaml --> block", quickstart.DuoFlow)
	}
	tested, err := os.ReadFile(filepath.Join(root, "tests", "e2e", "testdata", "site-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	have := valueKeys(t, tested)
	for _, key := range valueKeys(t, []byte(documented)) {
		if !slices.Contains(have, key) {
			t.Errorf("tests/e2e/testdata/site-values.yaml lacks %s, which docs/install.md's site-values.yaml sets", key)
		}
	}
}

// valueKeys are the dotted paths of every value in a values file (lists are values).
func valueKeys(t *testing.T, values []byte) []string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(values, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
				walk(prefix+k+".", sub)
				continue
			}
			keys = append(keys, prefix+k)
		}
	}
	walk("", m)
	slices.Sort(keys)
	return keys
}
