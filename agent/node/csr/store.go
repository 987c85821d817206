package csr

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	certclient "k8s.io/client-go/kubernetes/typed/certificates/v1"
)

// Load reads a key and certificate stored by Save; its Leaf is set.
func Load(file string) (*tls.Certificate, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(data, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &cert, nil
}

// Save replaces file with the key and certificate in one PEM file, so
// that a crash leaves either the old pair or the new one.
func Save(file string, keyPEM, certPEM []byte) error {
	dir := filepath.Dir(file)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("store certificate: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(file)+"-*")
	if err != nil {
		return fmt.Errorf("store certificate: %w", err)
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	_, err = f.Write(append(append([]byte(nil), keyPEM...), certPEM...))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), file)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("store certificate in %s: %w", file, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Usable checks that leaf names the node nodeName and has not expired at
// now. It does not check who signed it: the signers may use other CAs
// than the API server's serving certificate.
func Usable(leaf *x509.Certificate, nodeName string, now time.Time) error {
	want := NodeUserPrefix + nodeName
	if leaf.Subject.CommonName != want || !slices.Equal(leaf.Subject.Organization, []string{NodesGroup}) {
		return fmt.Errorf("certificate is for %q in %q, not %q in %q",
			leaf.Subject.CommonName, leaf.Subject.Organization, want, NodesGroup)
	}
	if !now.Before(leaf.NotAfter) {
		return fmt.Errorf("certificate expired at %v", leaf.NotAfter)
	}
	return nil
}

// Get requests a certificate for spec (see Request), checks that it is
// the node's at now and stores it in file (see Save). It returns it with
// its Leaf set.
func Get(ctx context.Context, csrs certclient.CertificateSigningRequestInterface, spec Spec, file string, now func() time.Time, log *slog.Logger) (*tls.Certificate, error) {
	certPEM, keyPEM, err := Request(ctx, csrs, spec, log)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("issued certificate: %w", err)
	}
	if err := Usable(cert.Leaf, spec.NodeName, now()); err != nil {
		return nil, fmt.Errorf("issued certificate: %w", err)
	}
	if err := Save(file, keyPEM, certPEM); err != nil {
		return nil, err
	}
	return &cert, nil
}
