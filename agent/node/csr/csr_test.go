package csr

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/cairn-os/cairn/machineconfig"
)

func TestUsable(t *testing.T) {
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	cert := func(cn string, orgs []string, notAfter time.Time) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: cn, Organization: orgs}, NotAfter: notAfter}
	}
	later := now.Add(time.Hour)
	tests := []struct {
		name string
		cert *x509.Certificate
		want string
	}{
		{"good", cert("system:node:node-1", []string{"system:nodes"}, later), ""},
		{"other node", cert("system:node:node-2", []string{"system:nodes"}, later),
			`certificate is for "system:node:node-2" in ["system:nodes"], not "system:node:node-1" in "system:nodes"`},
		{"extra group", cert("system:node:node-1", []string{"system:nodes", "system:masters"}, later),
			`certificate is for "system:node:node-1" in ["system:nodes" "system:masters"], not "system:node:node-1" in "system:nodes"`},
		{"expired", cert("system:node:node-1", []string{"system:nodes"}, now), "certificate expired at 2026-06-01 00:00:00 +0000 UTC"},
	}
	for _, tt := range tests {
		if got := errString(Usable(tt.cert, "node-1", now)); got != tt.want {
			t.Errorf("usable(%s) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestDeadline(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		serial int64
		want   time.Duration
	}{
		{0, 70 * time.Hour},
		{500, 80 * time.Hour},
		{999, 89*time.Hour + 58*time.Minute + 48*time.Second},
		{1250, 75 * time.Hour},
	}
	for _, tt := range tests {
		leaf := &x509.Certificate{SerialNumber: big.NewInt(tt.serial), NotBefore: nb, NotAfter: nb.Add(100 * time.Hour)}
		if got, want := Deadline(leaf), nb.Add(tt.want); !got.Equal(want) {
			t.Errorf("Deadline(100 h certificate, serial %d) = %v, want %v", tt.serial, got, want)
		}
	}
}

func TestSaveLoadCert(t *testing.T) {
	now := time.Now()
	ca, err := machineconfig.NewCA("test", now)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueClient("system:node:n", machineconfig.RoleReader, now)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "pki", "client.pem")
	if _, err := Load(file); !os.IsNotExist(err) {
		t.Errorf("Load() of a missing file = %v, want not exist", err)
	}
	if err := Save(file, keyPEM, certPEM); err != nil {
		t.Fatal(err)
	}
	cert, err := Load(file)
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	if cert.Leaf == nil || cert.Leaf.Subject.CommonName != "system:node:n" {
		t.Errorf("Load() leaf = %v, want the saved certificate", cert.Leaf)
	}
	entries, _ := os.ReadDir(filepath.Dir(file))
	if len(entries) != 1 {
		t.Errorf("pki directory holds %d entries, want only client.pem", len(entries))
	}
	if err := os.WriteFile(file, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(file); err == nil {
		t.Errorf("Load() of a certificate without its key: no error")
	}
}

func TestIssued(t *testing.T) {
	cond := func(typ certv1.RequestConditionType, status corev1.ConditionStatus) certv1.CertificateSigningRequestCondition {
		return certv1.CertificateSigningRequestCondition{Type: typ, Status: status, Reason: "R", Message: "M"}
	}
	tests := []struct {
		name       string
		conditions []certv1.CertificateSigningRequestCondition
		cert       []byte
		wantDone   bool
		wantErr    string
	}{
		{name: "pending"},
		{name: "approved, not signed yet", conditions: []certv1.CertificateSigningRequestCondition{cond(certv1.CertificateApproved, "True")}},
		{name: "signed", conditions: []certv1.CertificateSigningRequestCondition{cond(certv1.CertificateApproved, "True")}, cert: []byte("C"), wantDone: true},
		{name: "denied", conditions: []certv1.CertificateSigningRequestCondition{cond(certv1.CertificateDenied, "True")}, wantDone: true, wantErr: "denied: R: M"},
		{name: "failed", conditions: []certv1.CertificateSigningRequestCondition{cond(certv1.CertificateApproved, "True"), cond(certv1.CertificateFailed, "True")}, wantDone: true, wantErr: "failed: R: M"},
		{name: "approval withdrawn", conditions: []certv1.CertificateSigningRequestCondition{cond(certv1.CertificateApproved, "False")}, cert: []byte("C")},
	}
	for _, tt := range tests {
		csr := &certv1.CertificateSigningRequest{Status: certv1.CertificateSigningRequestStatus{Conditions: tt.conditions, Certificate: tt.cert}}
		cert, done, err := issued(csr)
		if done != tt.wantDone || errString(err) != tt.wantErr || (tt.wantDone && tt.wantErr == "" && string(cert) != "C") {
			t.Errorf("issued(%s) = %q, %v, %v; want done %v, error %q", tt.name, cert, done, err, tt.wantDone, tt.wantErr)
		}
	}
}
