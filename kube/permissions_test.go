package kube_test

import (
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// rbacObjects renders the chart (with cold starts on, so every Role is there) and returns the
// Roles and ClusterRoles bound to the executor's ServiceAccount, by name.
func rbacObjects(t *testing.T) (roles, clusterRoles map[string]rbacv1.Role) {
	t.Helper()
	objs := helmchart.Render(t, "sandbox-executor", "sandbox-executor", "coldStart: {enabled: true}\n")
	roles, clusterRoles = map[string]rbacv1.Role{}, map[string]rbacv1.Role{}
	for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
		for _, u := range objs.OfKind(kind) {
			var b rbacv1.RoleBinding
			objs.Decode(t, kind, u.GetName(), &b)
			if len(b.Subjects) != 1 || b.Subjects[0].Name != "sandbox-executor" {
				continue
			}
			var r rbacv1.Role
			objs.Decode(t, b.RoleRef.Kind, b.RoleRef.Name, &r)
			if b.RoleRef.Kind == "Role" {
				roles[r.Name] = r
			} else {
				clusterRoles[r.Name] = r
			}
		}
	}
	return roles, clusterRoles
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

// The chart's Roles grant the executor's ServiceAccount exactly what the code calls: no more
// (least privilege), no less (a missing verb is a job failing in production with "RBAC denied").
// What jobs need (Role sandbox-executor), what cold starts add (sandbox-executor-cold-images, only
// with coldStart.enabled), what doctor reads (sandbox-executor-doctor), and nothing else.
func TestChartGrantsExactlyThePermissions(t *testing.T) {
	roles, clusterRoles := rbacObjects(t)
	for _, want := range []struct {
		kind, name string
		roles      map[string]rbacv1.Role
		list       string
		perms      []kube.Permission
	}{
		{"Role", "sandbox-executor", roles, "kube.RequiredPermissions", kube.RequiredPermissions},
		{"Role", "sandbox-executor-cold-images", roles, "kube.ColdStartPermissions", kube.ColdStartPermissions},
		{"Role", "sandbox-executor-doctor", roles, "kube.DoctorPermissions", kube.DoctorPermissions},
		{"ClusterRole", "sandbox-executor-doctor", clusterRoles, "kube.ClusterPermissions", kube.ClusterPermissions},
	} {
		role, ok := want.roles[want.name]
		if !ok {
			t.Errorf("the chart binds no %s %s to the executor's ServiceAccount", want.kind, want.name)
			continue
		}
		assertSameGrants(t, want.kind+" "+want.name, granted(t, want.kind, role.Rules), want.list, wanted(want.perms))
	}
	if len(roles)+len(clusterRoles) != 4 {
		t.Errorf("the executor's ServiceAccount is bound to %d roles, want exactly the four above", len(roles)+len(clusterRoles))
	}
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
	for _, p := range slices.Concat(kube.RequiredPermissions, kube.ColdStartPermissions, kube.DoctorPermissions, kube.ClusterPermissions) {
		if seen[p.String()] {
			t.Errorf("%s listed twice", p)
		}
		seen[p.String()] = true
		if p.Why == "" || p.Verb == "" || p.Resource == "" {
			t.Errorf("%+v: every permission names its resource, verb and why", p)
		}
	}
}
