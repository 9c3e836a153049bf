package kube

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// apiCall names one API request, so that a failure can say what to fix.
type apiCall struct {
	Verb      string
	Resource  string // plural resource with group, as GroupResource.String() spells it
	Namespace string
	Name      string
}

func (c apiCall) String() string {
	s := c.Verb + " " + c.Resource
	if c.Name != "" {
		s += " " + c.Name
	}
	return s + " in namespace " + c.Namespace
}

// explainAPIError turns an API error into a classified, one-line error naming the fix.
func explainAPIError(err error, call apiCall) error {
	if err == nil {
		return nil
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return failure.SystemError(nil, "kubernetes API unreachable (%s): %v", call, err)
	}
	s := status.Status()
	switch {
	case apierrors.IsForbidden(err):
		return failure.PermanentError(nil, "RBAC denied: cannot %s %s in namespace %s; grant the executor's identity the %q verb on %q (the chart deploy/chart grants exactly these)",
			call.Verb, call.Resource, call.Namespace, call.Verb, call.Resource)
	case apierrors.IsUnauthorized(err):
		return failure.PermanentError(nil, "kubernetes API rejected the executor's credentials (%s): check kubeconfig or the service account token", call)
	case apierrors.IsNotFound(err) && isMissingResourceType(s):
		return failure.PermanentError(nil, "CRD missing: the API server does not serve %s; install agent-sandbox v0.5.6 with its extensions CRDs", call.Resource)
	case apierrors.IsNotFound(err):
		return failure.PermanentError(nil, "%s not found: %s/%s", call.Resource, call.Namespace, call.Name)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return failure.PermanentError(nil, "kubernetes API refused %s: %s", call, s.Message)
	default:
		// Timeouts, throttling, 5xx, conversion webhook outages: worth a retry.
		return failure.SystemError(nil, "kubernetes API error (%s): %s", call, failure.OneLine(s.Message))
	}
}

// isMissingResourceType tells "no such kind" from "no such object": for an unknown resource the
// API server answers 404 without naming an object.
func isMissingResourceType(s metav1.Status) bool {
	return s.Details == nil || s.Details.Name == ""
}

// isObjectNotFound is true when the named object does not exist, as opposed to its kind.
func isObjectNotFound(err error) bool {
	var status apierrors.APIStatus
	return apierrors.IsNotFound(err) && errors.As(err, &status) && !isMissingResourceType(status.Status())
}
