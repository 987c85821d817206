package machineconfig

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"testing"
	"time"
)

func mustParseCert(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		t.Fatalf("parse certificate: %v", err)
	}
	return cert
}

func TestNewCA(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ca, err := NewCA("test ca", now)
	if err != nil {
		t.Fatalf("NewCA() = %v", err)
	}
	cert := mustParseCert(t, ca.CertPEM)
	if !cert.IsCA || cert.Subject.CommonName != "test ca" {
		t.Errorf("NewCA() cert IsCA = %v, CN = %q, want true, %q", cert.IsCA, cert.Subject.CommonName, "test ca")
	}
	if want := now.AddDate(10, 0, 0); !cert.NotAfter.Equal(want) {
		t.Errorf("NewCA() NotAfter = %v, want %v", cert.NotAfter, want)
	}
	if cert.SerialNumber.BitLen() > 128 {
		t.Errorf("NewCA() serial has %d bits, want at most 128", cert.SerialNumber.BitLen())
	}

	loaded, err := LoadCA(ca.CertPEM, ca.KeyPEM)
	if err != nil {
		t.Fatalf("LoadCA(NewCA()) = %v", err)
	}
	// The loaded CA must be able to sign.
	if _, _, err := loaded.IssueClient("c", RoleReader, now); err != nil {
		t.Errorf("IssueClient() from a loaded CA = %v", err)
	}
}

func TestLoadCAErrors(t *testing.T) {
	f := testFixture(t)
	tests := []struct {
		name          string
		certPEM, key  string
		wantErrSubstr string
	}{
		{"bad cert", "junk", f.key, "CA certificate: not a PEM certificate"},
		{"leaf cert", f.cert, f.key, "CA certificate: not a CA certificate"},
		{"bad key", f.ca, "junk", "CA key: not a PEM private key"},
		{"key of another certificate", f.ca, f.key, "CA key: does not match the CA certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadCA([]byte(tt.certPEM), []byte(tt.key))
			if err == nil || err.Error() != tt.wantErrSubstr {
				t.Errorf("LoadCA() = %v, want %q", err, tt.wantErrSubstr)
			}
		})
	}
}

func TestIssueServerVerifies(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("test ca", now)
	if err != nil {
		t.Fatalf("NewCA() = %v", err)
	}
	certPEM, keyPEM, err := ca.IssueServer("node-1", []string{"node-1", "localhost"}, []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.2.15")}, now)
	if err != nil {
		t.Fatalf("IssueServer() = %v", err)
	}
	cert := mustParseCert(t, certPEM)
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		t.Fatalf("IssueServer() key: %v", err)
	}
	if !keyMatches(cert, key) {
		t.Errorf("IssueServer() key does not match its certificate")
	}
	roots := x509.NewCertPool()
	roots.AddCert(mustParseCert(t, ca.CertPEM))
	tests := []struct {
		name string
		ok   bool
	}{
		{"node-1", true},
		{"localhost", true},
		{"127.0.0.1", true},
		{"10.0.2.15", true},
		{"node-2", false},
		{"10.0.2.16", false},
	}
	for _, tt := range tests {
		_, err := cert.Verify(x509.VerifyOptions{
			DNSName:     tt.name,
			Roots:       roots,
			CurrentTime: now,
			KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if (err == nil) != tt.ok {
			t.Errorf("Verify(%q) = %v, want ok %v", tt.name, err, tt.ok)
		}
	}
}

func TestIssueClientRoles(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("test ca", now)
	if err != nil {
		t.Fatalf("NewCA() = %v", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(mustParseCert(t, ca.CertPEM))
	var serials []string
	for _, role := range []string{RoleAdmin, RoleOperator, RoleReader} {
		certPEM, _, err := ca.IssueClient("someone", role, now)
		if err != nil {
			t.Fatalf("IssueClient(%q) = %v", role, err)
		}
		cert := mustParseCert(t, certPEM)
		if got, ok := RoleFromCert(cert); got != role || !ok {
			t.Errorf("RoleFromCert(IssueClient(%q)) = %q, %v, want %q, true", role, got, ok, role)
		}
		if _, err := cert.Verify(x509.VerifyOptions{
			Roots:       roots,
			CurrentTime: now,
			KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}); err != nil {
			t.Errorf("Verify(IssueClient(%q)) = %v", role, err)
		}
		serials = append(serials, cert.SerialNumber.String())
	}
	if serials[0] == serials[1] || serials[1] == serials[2] {
		t.Errorf("IssueClient() serials %v repeat", serials)
	}
	if _, _, err := ca.IssueClient("someone", "root", now); err == nil {
		t.Errorf("IssueClient(role %q) = nil error, want an error", "root")
	}
}

func TestRoleFromCert(t *testing.T) {
	tests := []struct {
		orgs     []string
		wantRole string
		wantOK   bool
	}{
		{[]string{"os:admin"}, RoleAdmin, true},
		{[]string{"acme", "os:reader"}, RoleReader, true},
		{nil, "", false},
		{[]string{"acme"}, "", false},
		{[]string{"os:root"}, "", false},
		{[]string{"os:reader", "os:admin"}, "", false},
	}
	for _, tt := range tests {
		cert := &x509.Certificate{Subject: pkix.Name{Organization: tt.orgs}}
		role, ok := RoleFromCert(cert)
		if role != tt.wantRole || ok != tt.wantOK {
			t.Errorf("RoleFromCert(O=%q) = %q, %v, want %q, %v", tt.orgs, role, ok, tt.wantRole, tt.wantOK)
		}
	}
}
