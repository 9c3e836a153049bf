package kube_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/kube"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// rbacObjects reads the Roles and ClusterRoles of a multi-document manifest, by name.
func rbacObjects(t *testing.T, path string) (roles, clusterRoles map[string]rbacv1.Role) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	roles, clusterRoles = map[string]rbacv1.Role{}, map[string]rbacv1.Role{}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj struct {
			Kind string `json:"kind"`
			rbacv1.Role
		}
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return roles, clusterRoles
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch obj.Kind {
		case "Role":
			roles[obj.Name] = obj.Role
		case "ClusterRole":
			clusterRoles[obj.Name] = obj.Role
		}
	}
}

// granted flattens RBAC rules to one Permission per verb, refusing what a list cannot express.
func granted(t *testing.T, name string, rules []rbacv1.PolicyRule) []string {
	t.Helper()
	var out []string
	for _, r := range rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("%s: rule %v: resourceNames/nonResourceURLs are not expected", name, r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					if g == "*" || res == "*" || v == "*" {
						t.Errorf("%s: wildcard in rule %v", name, r)
					}
					out = append(out, kube.Permission{Group: g, Resource: res, Verb: v}.String())
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func wanted(perms []kube.Permission) []string {
	var out []string
	for _, p := range perms {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

// The shipped Role grants exactly what the code calls: no more (least privilege), no less (a
// missing verb is a job failing in production with "RBAC denied").
func TestRoleGrantsExactlyRequiredPermissions(t *testing.T) {
	roles, clusterRoles := rbacObjects(t, "../deploy/base/rbac.yaml")
	role, ok := roles["sandbox-executor"]
	if !ok {
		t.Fatal("deploy/base/rbac.yaml has no Role sandbox-executor")
	}
	assertSameGrants(t, "Role sandbox-executor", granted(t, "Role", role.Rules), "kube.RequiredPermissions", wanted(kube.RequiredPermissions))
	doctor, ok := clusterRoles["sandbox-executor-doctor"]
	if !ok {
		t.Fatal("deploy/base/rbac.yaml has no ClusterRole sandbox-executor-doctor")
	}
	assertSameGrants(t, "ClusterRole sandbox-executor-doctor", granted(t, "ClusterRole", doctor.Rules), "kube.ClusterPermissions", wanted(kube.ClusterPermissions))
	if len(roles)+len(clusterRoles) != 2 {
		t.Errorf("deploy/base/rbac.yaml defines %d roles, want exactly the two above", len(roles)+len(clusterRoles))
	}
}

// The cold-images component grants exactly what unknown_image = "cold" adds, and nothing else;
// the default Role grants none of it (creating Sandboxes is opt-in).
func TestColdImagesComponentGrantsExactlyColdStartPermissions(t *testing.T) {
	roles, clusterRoles := rbacObjects(t, "../deploy/components/cold-images/rbac.yaml")
	role, ok := roles["sandbox-executor-cold-images"]
	if !ok || len(roles) != 1 || len(clusterRoles) != 0 {
		t.Fatalf("deploy/components/cold-images/rbac.yaml must define exactly the Role sandbox-executor-cold-images: %d roles, %d cluster roles", len(roles), len(clusterRoles))
	}
	// TestPermissionsAreUniqueAndExplained keeps these out of RequiredPermissions, the default Role.
	assertSameGrants(t, "Role sandbox-executor-cold-images", granted(t, "Role", role.Rules), "kube.ColdStartPermissions", wanted(kube.ColdStartPermissions))
}

func assertSameGrants(t *testing.T, role string, got []string, list string, want []string) {
	t.Helper()
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("%s grants %q, which no entry of %s needs", role, g, list)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s lacks %q, which %s needs", role, w, list)
		}
	}
}

func TestPermissionsAreUniqueAndExplained(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range slices.Concat(kube.RequiredPermissions, kube.ColdStartPermissions, kube.ClusterPermissions) {
		if seen[p.String()] {
			t.Errorf("%s listed twice", p)
		}
		seen[p.String()] = true
		if p.Why == "" || p.Verb == "" || p.Resource == "" {
			t.Errorf("%+v: every permission names its resource, verb and why", p)
		}
	}
}
