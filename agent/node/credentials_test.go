package node

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

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

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
