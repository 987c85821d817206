package machineconfig

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"time"
)

// Roles a client certificate can carry. They are stored in the
// certificate's Subject.Organization as "os:<role>".
const (
	RoleAdmin    = "admin"
	RoleOperator = "operator"
	RoleReader   = "reader"
)

// rolePrefix marks an Organization entry that holds a role.
const rolePrefix = "os:"

func validRole(role string) bool {
	return role == RoleAdmin || role == RoleOperator || role == RoleReader
}

// RoleFromCert returns the role of a client certificate. It reports false
// unless the certificate carries exactly one "os:" organization and it
// names a known role.
func RoleFromCert(cert *x509.Certificate) (string, bool) {
	var roles []string
	for _, org := range cert.Subject.Organization {
		if role, ok := strings.CutPrefix(org, rolePrefix); ok {
			roles = append(roles, role)
		}
	}
	if len(roles) != 1 || !validRole(roles[0]) {
		return "", false
	}
	return roles[0], true
}

const (
	caValidityYears = 10
	// leafValidityYears matches the CA because nothing rotates
	// certificates yet; shorten it once rotation exists.
	leafValidityYears = 10
	// clockSkew backdates certificates so that a node whose clock is
	// slightly behind the operator's accepts them.
	clockSkew = time.Hour
)

// CA is a certificate authority for the node API.
type CA struct {
	CertPEM []byte
	KeyPEM  []byte

	cert *x509.Certificate
	key  crypto.Signer
}

// NewCA creates a self-signed ECDSA P-256 CA valid for 10 years from now.
func NewCA(commonName string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.AddDate(caValidityYears, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return LoadCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM)
}

// LoadCA parses a CA from its PEM certificate and private key.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("CA certificate: not a CA certificate")
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !keyMatches(cert, key) {
		return nil, errors.New("CA key: does not match the CA certificate")
	}
	return &CA{CertPEM: certPEM, KeyPEM: keyPEM, cert: cert, key: key}, nil
}

// IssueServer issues a server certificate for the given DNS names and IP
// addresses and returns it with its private key, both PEM-encoded.
func (ca *CA) IssueServer(commonName string, dnsNames []string, ips []net.IP, now time.Time) (certPEM, keyPEM []byte, err error) {
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		DNSNames:    dnsNames,
		IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, now)
}

// IssueClient issues a client certificate carrying role, one of RoleAdmin,
// RoleOperator or RoleReader, and returns it with its private key, both
// PEM-encoded.
func (ca *CA) IssueClient(commonName, role string, now time.Time) (certPEM, keyPEM []byte, err error) {
	if !validRole(role) {
		return nil, nil, fmt.Errorf("unknown role %q: use %s, %s or %s", role, RoleAdmin, RoleOperator, RoleReader)
	}
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName, Organization: []string{rolePrefix + role}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, now)
}

// issue completes tmpl with a fresh key, serial and validity, and signs it.
func (ca *CA) issue(tmpl *x509.Certificate, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	if tmpl.SerialNumber, err = newSerial(); err != nil {
		return nil, nil, err
	}
	tmpl.NotBefore = now.Add(-clockSkew)
	tmpl.NotAfter = now.AddDate(leafValidityYears, 0, 0)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	if keyPEM, err = encodeKey(key); err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// newSerial returns a random 128-bit serial number.
func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return serial, nil
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCertPEM parses the first PEM block of data as a certificate.
func parseCertPEM(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("not a PEM certificate: %w", err)
	}
	return cert, nil
}

// parseKeyPEM parses the first PEM block of data as a PKCS #8, SEC 1 (EC)
// or PKCS #1 (RSA) private key.
func parseKeyPEM(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("not a PEM private key")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, errors.New("not a PEM private key")
	}
	if err != nil {
		return nil, fmt.Errorf("not a PEM private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("not a PEM private key: unsupported key type %T", key)
	}
	return signer, nil
}

// keyMatches reports whether key is the private key of cert.
func keyMatches(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(key.Public())
}
