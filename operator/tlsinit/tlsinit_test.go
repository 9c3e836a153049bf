package tlsinit_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/operator/tlsinit"
)

// tls init makes a CA the executor loads, keeps its key private, and never overwrites one.
func TestInitMakesALoadableCAOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "agent-ca")
	var out bytes.Buffer
	if err := tlsinit.Run(&out, tlsinit.Options{Dir: dir, Validity: 48 * time.Hour, Name: "test"}); err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	ca, err := agentca.Load(cert, key)
	if err != nil {
		t.Fatalf("the CA written does not load: %v", err)
	}
	if left := time.Until(ca.NotAfter()); left < 47*time.Hour || left > 49*time.Hour {
		t.Errorf("the CA expires in %s, want --validity 48h", left)
	}
	if info, err := os.Stat(key); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("the key's mode: %v, %v; want 0600", info.Mode(), err)
	}
	if !strings.Contains(out.String(), "create configmap sandbox-executor-agent-ca") {
		t.Errorf("no install steps printed:\n%s", out.String())
	}
	before, _ := os.ReadFile(key)
	err = tlsinit.Run(&out, tlsinit.Options{Dir: dir, Validity: 48 * time.Hour})
	if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a second init: %v; want a permanent error saying the CA exists", err)
	}
	if after, _ := os.ReadFile(key); !bytes.Equal(before, after) {
		t.Error("a second init changed the key")
	}
	if err := tlsinit.Run(&out, tlsinit.Options{Dir: t.TempDir(), Validity: time.Hour}); failure.KindOf(err) != failure.KindPermanent {
		t.Errorf("a CA valid for an hour: %v; want refused", err)
	}
}

// In the cluster (the chart's hook Job), tls init makes the CA's Secret and ConfigMap once and
// keeps them on every later run, remakes a deleted ConfigMap from the Secret, and refuses a
// ConfigMap of another CA rather than leave job pods trusting the wrong one.
func TestInitInClusterMakesTheCAOnlyWhenAbsent(t *testing.T) {
	ctx := context.Background()
	clients := &kube.Clients{Kube: fake.NewClientset()}
	at := kube.AgentCAObjects{Namespace: "ci", Secret: "agent-ca", ConfigMap: "agent-ca"}
	opts := tlsinit.Options{Validity: 48 * time.Hour, Name: "test"}
	var out bytes.Buffer
	if err := tlsinit.RunInCluster(ctx, &out, clients, at, opts); err != nil {
		t.Fatal(err)
	}
	secret, err := clients.Kube.CoreV1().Secrets("ci").Get(ctx, "agent-ca", metav1.GetOptions{})
	if err != nil || secret.Type != corev1.SecretTypeTLS {
		t.Fatalf("Secret agent-ca: %v, %+v; want a kubernetes.io/tls Secret", err, secret)
	}
	if _, err := agentca.Parse(secret.Data["tls.crt"], secret.Data["tls.key"]); err != nil {
		t.Fatalf("the CA in the Secret does not load: %v", err)
	}
	cm, err := clients.Kube.CoreV1().ConfigMaps("ci").Get(ctx, "agent-ca", metav1.GetOptions{})
	if err != nil || cm.Data["ca.crt"] != string(secret.Data["tls.crt"]) || len(cm.Data) != 1 {
		t.Fatalf("ConfigMap agent-ca: %v, %v; want the certificate alone", err, cm)
	}
	if !strings.Contains(out.String(), "Agent CA made") {
		t.Errorf("first run says %q", out.String())
	}

	if err := clients.Kube.CoreV1().ConfigMaps("ci").Delete(ctx, "agent-ca", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := tlsinit.RunInCluster(ctx, &out, clients, at, opts); err != nil {
		t.Fatal(err)
	}
	again, _ := clients.Kube.CoreV1().Secrets("ci").Get(ctx, "agent-ca", metav1.GetOptions{})
	if !bytes.Equal(again.Data["tls.key"], secret.Data["tls.key"]) || !strings.Contains(out.String(), "Agent CA kept") {
		t.Errorf("an upgrade replaced the CA (or did not say it kept it: %q)", out.String())
	}
	if cm, err := clients.Kube.CoreV1().ConfigMaps("ci").Get(ctx, "agent-ca", metav1.GetOptions{}); err != nil || cm.Data["ca.crt"] != string(secret.Data["tls.crt"]) {
		t.Errorf("the deleted ConfigMap was not made again from the Secret: %v", err)
	}

	cm.Data["ca.crt"] = "another CA"
	if _, err := clients.Kube.CoreV1().ConfigMaps("ci").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = tlsinit.RunInCluster(ctx, &out, clients, at, opts)
	if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(err.Error(), "delete the ConfigMap") {
		t.Errorf("a ConfigMap of another CA: %v; want a permanent error naming the fix", err)
	}
}

// A Secret of that name that is not a CA (say, a typo naming another Secret) is refused, not used.
func TestInitInClusterRefusesASecretWithoutACA(t *testing.T) {
	clients := &kube.Clients{Kube: fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-ca", Namespace: "ci"},
		Data:       map[string][]byte{"runner-token": []byte("glrt-x")},
	})}
	err := tlsinit.RunInCluster(context.Background(), io.Discard, clients, kube.AgentCAObjects{Namespace: "ci", Secret: "agent-ca", ConfigMap: "agent-ca"}, tlsinit.Options{Validity: 48 * time.Hour})
	if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(err.Error(), "has no tls.crt and tls.key") {
		t.Errorf("got %v; want a permanent error naming what the Secret lacks", err)
	}
}

// Two hook Jobs at once (two upgrades racing): the one whose create loses keeps the winner's CA
// and makes the ConfigMap from it, so job pods and runners agree.
func TestInitInClusterLosingTheRaceKeepsTheWinnersCA(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	winner, winnerKey, err := agentca.Generate("winner", 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client.PrependReactor("create", "secrets", func(action k8stesting.Action) (bool, k8sruntime.Object, error) {
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "agent-ca", Namespace: "ci"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": winner, "tls.key": winnerKey}}
		if err := client.Tracker().Add(secret); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewAlreadyExists(corev1.Resource("secrets"), "agent-ca")
	})
	var out bytes.Buffer
	at := kube.AgentCAObjects{Namespace: "ci", Secret: "agent-ca", ConfigMap: "agent-ca"}
	if err := tlsinit.RunInCluster(ctx, &out, &kube.Clients{Kube: client}, at, tlsinit.Options{Validity: 48 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	cm, err := client.CoreV1().ConfigMaps("ci").Get(ctx, "agent-ca", metav1.GetOptions{})
	if err != nil || cm.Data["ca.crt"] != string(winner) || !strings.Contains(out.String(), "kept") {
		t.Errorf("after a lost race the ConfigMap holds another CA than the Secret (%v), or the run says %q", err, out.String())
	}
}
