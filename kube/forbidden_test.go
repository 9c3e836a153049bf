package kube_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// restartedAPIServer answers its first `denials` requests 403 Forbidden, as an API server whose
// RBAC authorizer has not synced yet, then serves one pod (and says it created it).
type restartedAPIServer struct {
	denials int

	mu     sync.Mutex
	bodies []string // of every request, in order
}

func (s *restartedAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.bodies = append(s.bodies, string(body))
	denied := len(s.bodies) <= s.denials
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if denied {
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status:   metav1.StatusFailure, Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden,
			Message: `pods "job-pod" is forbidden: User "system:serviceaccount:sandbox-executor:executor" cannot get resource "pods"`,
		})
		return
	}
	if r.Method == http.MethodPost {
		w.WriteHeader(http.StatusCreated)
	}
	_ = json.NewEncoder(w).Encode(corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: "job-pod", Namespace: "ns"}})
}

func (s *restartedAPIServer) sent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

// clientsetOf is the clientset of RESTConfig for a kubeconfig naming the server at url.
func clientsetOf(t *testing.T, url string) kubernetes.Interface {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kubeconfig := `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: ` + url + `
users:
- name: test
  user:
    token: executor-token
contexts:
- name: test
  context:
    cluster: test
    user: test
current-context: test
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := kube.RESTConfig(&config.Config{Kubeconfig: path})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestTheClientsOfRESTConfigSendAForbiddenRequestAgain(t *testing.T) {
	ctx := kube.RetryForbidden(context.Background())
	t.Run("get", func(t *testing.T) {
		api := &restartedAPIServer{denials: 1}
		srv := httptest.NewServer(api)
		defer srv.Close()
		pod, err := clientsetOf(t, srv.URL).CoreV1().Pods("ns").Get(ctx, "job-pod", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Name != "job-pod" || len(api.sent()) != 2 {
			t.Fatalf("got pod %q after %d requests, want job-pod after 2", pod.Name, len(api.sent()))
		}
	})
	t.Run("create", func(t *testing.T) {
		api := &restartedAPIServer{denials: 1}
		srv := httptest.NewServer(api)
		defer srv.Close()
		want := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job-pod", Namespace: "ns", Labels: map[string]string{"job": "job-42"}}}
		if _, err := clientsetOf(t, srv.URL).CoreV1().Pods("ns").Create(ctx, want, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The body is the pod, in whichever encoding the clientset chose.
		sent := api.sent()
		if len(sent) != 2 || !strings.Contains(sent[0], "job-42") || sent[1] != sent[0] {
			t.Fatalf("sent %q, want the same pod twice", sent)
		}
	})
}

func TestTheClientsOfRESTConfigReturnAForbiddenAtOnceToAnUnmarkedContext(t *testing.T) {
	api := &restartedAPIServer{denials: 1}
	srv := httptest.NewServer(api)
	defer srv.Close()
	_, err := clientsetOf(t, srv.URL).CoreV1().Pods("ns").Get(context.Background(), "job-pod", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) || len(api.sent()) != 1 {
		t.Fatalf("error %v after %d requests, want a Forbidden after 1", err, len(api.sent()))
	}
}
