package chartinstall_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
)

// Marking the nodes as a gVisor pool and restoring them leaves each node as it was: a label or
// taint the node already had stays.
func TestMarkGVisorNodesRestoresWhatItChanged(t *testing.T) {
	plain := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "plain", Labels: map[string]string{"a": "b"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "other", Effect: corev1.TaintEffectNoExecute}}}}
	pool := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "pool", Labels: map[string]string{chartinstall.GVisorPool.Key: "gvisor"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{chartinstall.GVisorPool}}}
	kube := fake.NewClientset(plain.DeepCopy(), pool.DeepCopy())
	ctx := context.Background()
	untaint, unlabel, err := chartinstall.MarkGVisorNodes(ctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plain", "pool"} {
		n, _ := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if n.Labels[chartinstall.GVisorPool.Key] != "gvisor" || !n.Spec.Taints[len(n.Spec.Taints)-1].MatchTaint(&chartinstall.GVisorPool) {
			t.Errorf("node %s not marked: labels %v, taints %v", name, n.Labels, n.Spec.Taints)
		}
	}
	if err := untaint(); err != nil {
		t.Fatal(err)
	}
	if err := unlabel(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []*corev1.Node{plain, pool} {
		got, _ := kube.CoreV1().Nodes().Get(ctx, want.Name, metav1.GetOptions{})
		if !equality.Semantic.DeepEqual(got.Labels, want.Labels) || !equality.Semantic.DeepEqual(got.Spec.Taints, want.Spec.Taints) {
			t.Errorf("node %s after restore: labels %v taints %v, want %v %v", want.Name, got.Labels, got.Spec.Taints, want.Labels, want.Spec.Taints)
		}
	}
}
