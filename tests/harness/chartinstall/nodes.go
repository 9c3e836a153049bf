package chartinstall

import (
	"context"
	"errors"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// GVisorPool is the label and taint of a GKE Sandbox node pool, which docs/install.md's site
// values tolerate and select (runtimeClass.scheduling).
var GVisorPool = corev1.Taint{Key: "sandbox.gke.io/runtime", Value: "gvisor", Effect: corev1.TaintEffectNoSchedule}

// MarkGVisorNodes labels and taints every node as a GKE Sandbox node pool is. untaint removes
// the taint again and unlabel the label, each only where this added it; a node is changed on a
// fresh read each time, so what others change meanwhile is kept. They are nil only when the
// nodes could not be listed (nothing was changed).
func MarkGVisorNodes(ctx context.Context, kube kubernetes.Interface) (untaint, unlabel func() error, err error) {
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	var tainted, labelled []string
	untaint = func() error {
		return eachNode(kube, tainted, func(n *corev1.Node) {
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.MatchTaint(&GVisorPool) })
		})
	}
	unlabel = func() error {
		return eachNode(kube, labelled, func(n *corev1.Node) { delete(n.Labels, GVisorPool.Key) })
	}
	for _, node := range nodes.Items {
		if _, ok := node.Labels[GVisorPool.Key]; !ok {
			labelled = append(labelled, node.Name)
		}
		if !slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.MatchTaint(&GVisorPool) }) {
			tainted = append(tainted, node.Name)
		}
	}
	err = eachNode(kube, labelled, func(n *corev1.Node) { n.Labels[GVisorPool.Key] = GVisorPool.Value })
	if err == nil {
		err = eachNode(kube, tainted, func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, GVisorPool) })
	}
	return untaint, unlabel, err
}

// eachNode applies change to each named node, retrying on conflicts.
func eachNode(kube kubernetes.Interface, names []string, change func(*corev1.Node)) error {
	var errs []error
	for _, name := range names {
		errs = append(errs, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			node, err := kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if node.Labels == nil {
				node.Labels = map[string]string{}
			}
			change(node)
			_, err = kube.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{})
			return err
		}))
	}
	return errors.Join(errs...)
}
