// Package csr gets a node's certificates from its cluster through
// CertificateSigningRequests, stores them and renews them before they
// expire: the client certificate (signer kube-apiserver-client-kubelet,
// by agent/node) and the kubelet server's serving certificate (signer
// kubelet-serving, by agent/kubelet/server) go the same way.
//
//	certPEM, keyPEM, err := csr.Request(ctx, client.CertificatesV1().CertificateSigningRequests(),
//		csr.Spec{NodeName: name, Signer: certv1.KubeletServingSignerName, ...}, log)
package csr

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	certclient "k8s.io/client-go/kubernetes/typed/certificates/v1"

	"github.com/cairn-os/cairn/internal/backoff"
)

// Subject of a node's certificates, as the Node authorizer and the
// signers know it.
const (
	NodeUserPrefix = "system:node:"
	NodesGroup     = "system:nodes"
)

// requestTimeout bounds each call to the API server.
const requestTimeout = 10 * time.Second

// Spec is what a certificate is requested for. Its subject is always the
// node's: system:node:NAME in system:nodes.
type Spec struct {
	NodeName string
	// Signer is the CSR's signerName.
	Signer string
	// Usages are the CSR's key usages. The key is ECDSA, which does not
	// encipher keys: no key encipherment.
	Usages []certv1.KeyUsage
	// DNSNames and IPs are the subject alternative names, for a serving
	// certificate.
	DNSNames []string
	IPs      []net.IP
	// NamePrefix starts the CSR's generated name.
	NamePrefix string
}

// Request gets a certificate for spec from the cluster: it makes a new
// ECDSA P-256 key and a CSR, and waits until the CSR is approved and the
// certificate issued. It returns the certificate and the key, PEM. A
// denied or failed CSR is an error that gives its reason.
func Request(ctx context.Context, csrs certclient.CertificateSigningRequestInterface, spec Spec, log *slog.Logger) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: NodeUserPrefix + spec.NodeName, Organization: []string{NodesGroup}},
		DNSNames:    spec.DNSNames,
		IPAddresses: spec.IPs,
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("make CSR: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key: %w", err)
	}

	cctx, cancel := context.WithTimeout(ctx, requestTimeout)
	csr, err := csrs.Create(cctx, &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: spec.NamePrefix + spec.NodeName + "-"},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: spec.Signer,
			Usages:     spec.Usages,
		},
	}, metav1.CreateOptions{})
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("create CSR: %w", err)
	}
	log.Info("waiting for the CSR to be approved and signed", "csr", csr.Name, "signer", spec.Signer)
	certPEM, err = waitForCertificate(ctx, csrs, csr.Name, log)
	if err != nil {
		return nil, nil, fmt.Errorf("CSR %s: %w", csr.Name, err)
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// waitForCertificate watches the CSR name until it has a certificate, or
// is denied, fails or disappears. It keeps waiting across API server
// restarts, for as long as ctx lasts: an approval may need a person.
func waitForCertificate(ctx context.Context, csrs certclient.CertificateSigningRequestInterface, name string, log *slog.Logger) ([]byte, error) {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	b := backoff.Backoff{Initial: 500 * time.Millisecond, Max: 10 * time.Second, Jitter: 0.2}
	for {
		started := time.Now()
		cert, done, err := listAndWatch(ctx, csrs, sel)
		switch {
		case done:
			return cert, err
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err == nil && time.Since(started) > time.Second:
			b.Reset() // the watch ended as watches do: list again now
			continue
		case err == nil:
			err = errors.New("watch ended at once")
		}
		d := b.Next()
		log.Warn("cannot watch the CSR; retrying", "csr", name, "err", err, "in", d.Round(time.Millisecond))
		if backoff.Sleep(ctx, backoff.RealClock, d) != nil {
			return nil, ctx.Err()
		}
	}
}

// listAndWatch looks at the CSR that sel selects, then watches it until
// it is done (see issued) or the watch ends.
func listAndWatch(ctx context.Context, csrs certclient.CertificateSigningRequestInterface, sel string) (cert []byte, done bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, requestTimeout)
	list, err := csrs.List(lctx, metav1.ListOptions{FieldSelector: sel})
	cancel()
	if err != nil {
		return nil, false, err
	}
	if len(list.Items) == 0 {
		return nil, true, errors.New("deleted before it was signed")
	}
	if cert, done, err := issued(&list.Items[0]); done {
		return cert, true, err
	}
	w, err := csrs.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		return nil, false, err
	}
	defer w.Stop()
	return watchUntilIssued(w)
}

// watchUntilIssued reads w until the CSR is done (see issued); done is
// false when the watch ended first.
func watchUntilIssued(w watch.Interface) (cert []byte, done bool, err error) {
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Added, watch.Modified:
			if csr, ok := ev.Object.(*certv1.CertificateSigningRequest); ok {
				if cert, done, err := issued(csr); done {
					return cert, true, err
				}
			}
		case watch.Deleted:
			return nil, true, errors.New("deleted before it was signed")
		case watch.Error:
			return nil, false, nil
		}
	}
	return nil, false, nil
}

// issued returns the certificate of csr when it was approved and signed,
// or an error when it was denied or failed; done is false while it is
// pending.
func issued(csr *certv1.CertificateSigningRequest) (cert []byte, done bool, err error) {
	approved := false
	for _, c := range csr.Status.Conditions {
		if c.Status == corev1.ConditionFalse {
			continue
		}
		switch c.Type {
		case certv1.CertificateDenied:
			return nil, true, fmt.Errorf("denied: %s: %s", c.Reason, c.Message)
		case certv1.CertificateFailed:
			return nil, true, fmt.Errorf("failed: %s: %s", c.Reason, c.Message)
		case certv1.CertificateApproved:
			approved = true
		}
	}
	if approved && len(csr.Status.Certificate) > 0 {
		return csr.Status.Certificate, true, nil
	}
	return nil, false, nil
}
