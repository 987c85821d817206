package volumes

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A token is renewed, as the kubelet does, once 80 % of its lifetime has
// passed or a day after it was issued, whichever comes first: the API
// server may issue kube-api-access tokens for a year while it still wants
// them renewed within an hour or so.
const (
	tokenRenewShare = 0.8
	tokenMaxAge     = 24 * time.Hour
)

// token is a service-account token as TokenRequest returned it.
type token struct {
	value   string
	renewAt time.Time
}

// renewAt is when a token issued at issued and expiring at expires is due
// for renewal.
func renewAt(issued, expires time.Time) time.Time {
	life := time.Duration(float64(expires.Sub(issued)) * tokenRenewShare)
	return issued.Add(min(life, tokenMaxAge))
}

// requestToken asks for a token of the pod's service account, bound to
// the pod, as src says.
func (m *Manager) requestToken(ctx context.Context, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection, now time.Time) (*token, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	got, err := m.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token of service account %s/%s: %w", pod.Namespace, sa, err)
	}
	return &token{value: got.Status.Token, renewAt: renewAt(now, got.Status.ExpirationTimestamp.Time)}, nil
}
