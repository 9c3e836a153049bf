package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// AgentCAObjects names where the agent CA lives in a namespace: a kubernetes.io/tls Secret
// (the key: runner pods only) and a ConfigMap with its ca.crt (job pods trust it).
type AgentCAObjects struct {
	Namespace, Secret, ConfigMap string
}

// EnsureAgentCA creates the agent CA's Secret from generate only when it does not exist (a
// replaced CA locks every runner out of every warm pod), then the ConfigMap from the Secret's
// certificate when that is missing. It reports whether it made a new CA. Two runs at once
// agree: the one whose create loses keeps the winner's Secret.
func (c *Clients) EnsureAgentCA(ctx context.Context, at AgentCAObjects, generate func() (certPEM, keyPEM []byte, err error)) (bool, error) {
	secrets := c.Kube.CoreV1().Secrets(at.Namespace)
	secretCall := apiCall{Verb: "get", Resource: "secrets", Namespace: at.Namespace, Name: at.Secret}
	secret, err := secrets.Get(ctx, at.Secret, metav1.GetOptions{})
	created := false
	if isObjectNotFound(err) {
		certPEM, keyPEM, genErr := generate()
		if genErr != nil {
			return false, failure.SystemError(genErr, "making the agent CA: %v", genErr)
		}
		secret, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: at.Secret, Namespace: at.Namespace},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
		}, metav1.CreateOptions{})
		created, secretCall.Verb = err == nil, "create"
		if apierrors.IsAlreadyExists(err) {
			secret, err = secrets.Get(ctx, at.Secret, metav1.GetOptions{})
		}
	}
	if err != nil {
		return false, explainAPIError(err, secretCall)
	}
	certPEM := secret.Data[corev1.TLSCertKey]
	if len(certPEM) == 0 || len(secret.Data[corev1.TLSPrivateKeyKey]) == 0 {
		return false, failure.PermanentError(nil, "Secret %s/%s has no %s and %s: delete it, or name a kubernetes.io/tls Secret of the agent CA", at.Namespace, at.Secret, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	configMaps := c.Kube.CoreV1().ConfigMaps(at.Namespace)
	cmCall := apiCall{Verb: "get", Resource: "configmaps", Namespace: at.Namespace, Name: at.ConfigMap}
	cm, err := configMaps.Get(ctx, at.ConfigMap, metav1.GetOptions{})
	switch {
	case isObjectNotFound(err):
		cmCall.Verb = "create"
		_, err = configMaps.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: at.ConfigMap, Namespace: at.Namespace},
			Data:       map[string]string{"ca.crt": string(certPEM)},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	case err == nil && cm.Data["ca.crt"] != string(certPEM):
		// Job pods would refuse every runner: a ConfigMap left from another CA is not ours to fix.
		return false, failure.PermanentError(nil, "ConfigMap %s/%s does not hold the certificate of Secret %s: delete the ConfigMap to have it made again", at.Namespace, at.ConfigMap, at.Secret)
	}
	if err != nil {
		return false, explainAPIError(err, cmCall)
	}
	return created, nil
}
