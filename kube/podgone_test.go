package kube_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// jobPod is a running job pod whose container has restarted `restarts` times.
func jobPod(restarts int32, last *corev1.ContainerStateTerminated) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "job-pod", Namespace: fakecluster.Namespace, UID: "uid-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:      "job",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name:                 "job",
			RestartCount:         restarts,
			State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			LastTerminationState: corev1.ContainerState{Terminated: last},
		}}},
	}
}

func TestPodGoneNamesARestartedJobContainer(t *testing.T) {
	sbx := &kube.Sandbox{Namespace: fakecluster.Namespace, Pod: "job-pod", PodUID: "uid-1", Container: "job", Restarts: 1}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want []string // "" alone: the pod can still run stages
	}{
		{"running as at prepare (restarted once before the job took it)", jobPod(1, &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1}), []string{""}},
		{"memory limit", jobPod(2, &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}),
			[]string{"job container job of pod sandbox-executor/job-pod restarted after OOMKilled, exit code 137", "memory limit of 2Gi"}},
		{"restarted after an error", jobPod(3, &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 128}),
			[]string{"restarted after Error, exit code 128", "processes and files are gone"}},
		{"restart seen before its reason", jobPod(2, nil), []string{"restarted; the job's processes and files are gone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := fakecluster.NewCluster(t)
			if _, err := fc.Kube.CoreV1().Pods(fakecluster.Namespace).Create(context.Background(), tc.pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			c := fc.Claimer()
			why, err := c.PodGone(context.Background(), sbx)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want[0] == "" {
				if why != "" {
					t.Fatalf("PodGone = %q, want the pod usable", why)
				}
				return
			}
			for _, w := range tc.want {
				if !strings.Contains(why, w) {
					t.Errorf("PodGone = %q, want it to contain %q", why, w)
				}
			}
		})
	}
}

func TestPodGoneNamesAnEviction(t *testing.T) {
	pod := jobPod(0, nil)
	pod.Status.Phase, pod.Status.Reason = corev1.PodFailed, "Evicted"
	pod.Status.Message = "Pod ephemeral local storage usage exceeds the total limit of containers 4Gi.\n"
	fc := fakecluster.NewCluster(t)
	if _, err := fc.Kube.CoreV1().Pods(fakecluster.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := fc.Claimer()
	why, _ := c.PodGone(context.Background(), &kube.Sandbox{Namespace: fakecluster.Namespace, Pod: "job-pod", PodUID: "uid-1", Container: "job"})
	if want := "is Failed (Evicted: Pod ephemeral local storage usage exceeds the total limit of containers 4Gi.)"; !strings.Contains(why, want) || strings.Contains(why, "\n") {
		t.Errorf("PodGone = %q, want one line containing %q", why, want)
	}
}

func TestClaimRecordsTheContainersRestartCount(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	c := fc.Claimer()
	sbx, err := c.Claim(context.Background(), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	pod, err := fc.Kube.CoreV1().Pods(fakecluster.Namespace).Get(context.Background(), sbx.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The fake pod has no container status: nothing recorded, and a status that appears later
	// with the same count is no restart.
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "job", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	if _, err := fc.Kube.CoreV1().Pods(fakecluster.Namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if why, err := c.PodGone(context.Background(), sbx); why != "" || err != nil {
		t.Fatalf("PodGone = %q, %v; want the pod usable", why, err)
	}
	pod.Status.ContainerStatuses[0].RestartCount = 1
	if _, err := fc.Kube.CoreV1().Pods(fakecluster.Namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if why, _ := c.PodGone(context.Background(), sbx); !strings.Contains(why, "restarted") {
		t.Fatalf("PodGone = %q after a restart, want it to say so", why)
	}
}
