package node

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/cairn-os/cairn/machineconfig"
)

// TestCertificateSwap shows, over real TLS and HTTP/2, that the node's
// transport presents the current certificate, and that a new one closes
// the connection made with the old one so that the next request presents
// the new one.
func TestCertificateSwap(t *testing.T) {
	now := time.Now()
	ca, err := machineconfig.NewCA("test", now)
	if err != nil {
		t.Fatal(err)
	}
	serverCert, serverKey, err := ca.IssueServer("api", nil, []net.IP{net.IPv4(127, 0, 0, 1)}, now)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s HTTP/%d", r.TLS.PeerCertificates[0].Subject.CommonName, r.ProtoMajor)
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAnyClientCert}
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()

	creds, err := newCredentials(credentialsConfig{
		cluster: &machineconfig.Cluster{Server: srv.URL, CA: string(ca.CertPEM), BootstrapToken: "abcdef.0123456789abcdef"},
		now:     time.Now, log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: creds.transport}
	get := func() string {
		t.Helper()
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	issue := func(cn string) *tls.Certificate {
		certPEM, keyPEM, err := ca.IssueClient(cn, machineconfig.RoleReader, now)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}

	creds.set(issue("first"))
	for range 2 {
		if got := get(); got != "first HTTP/2" {
			t.Fatalf("server saw %q, want first HTTP/2", got)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for two requests, want 1", n)
	}
	creds.set(issue("second"))
	if got := get(); got != "second HTTP/2" {
		t.Errorf("after the swap the server saw %q, want second HTTP/2", got)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections after the swap, want 2", n)
	}
}

func TestUsable(t *testing.T) {
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	cr := &credentials{credentialsConfig: credentialsConfig{nodeName: "node-1", now: func() time.Time { return now }}}
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
		if got := errString(cr.usable(tt.cert)); got != tt.want {
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

func TestRotateAt(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	leaf := &x509.Certificate{NotBefore: nb, NotAfter: nb.Add(100 * time.Hour)}
	if got, want := rotateAt(leaf), nb.Add(80*time.Hour); !got.Equal(want) {
		t.Errorf("rotateAt(100 h certificate) = %v, want %v", got, want)
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
	if _, err := loadCert(file); !os.IsNotExist(err) {
		t.Errorf("loadCert() of a missing file = %v, want not exist", err)
	}
	if err := saveCert(file, keyPEM, certPEM); err != nil {
		t.Fatal(err)
	}
	cert, err := loadCert(file)
	if err != nil {
		t.Fatalf("loadCert() = %v", err)
	}
	if cert.Leaf == nil || cert.Leaf.Subject.CommonName != "system:node:n" {
		t.Errorf("loadCert() leaf = %v, want the saved certificate", cert.Leaf)
	}
	entries, _ := os.ReadDir(filepath.Dir(file))
	if len(entries) != 1 {
		t.Errorf("pki directory holds %d entries, want only client.pem", len(entries))
	}
	if err := os.WriteFile(file, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadCert(file); err == nil {
		t.Errorf("loadCert() of a certificate without its key: no error")
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
