package agent

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/tlsprobe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cairn-os/cairn/agent/api"
	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/machineconfig"
)

// TestServeMetrics scrapes the metrics endpoint over mutual TLS with a
// client certificate of the node's CA, and is refused with one of another.
func TestServeMetrics(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := l.Addr().String()
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "unit", Endpoints: []string{endpoint}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	reg := newRegistry()
	probe := prometheus.NewCounter(prometheus.CounterOpts{Name: "cairn_test_probe_total", Help: "A counter the test reads back."})
	reg.MustRegister(probe)
	probe.Add(3)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	creds, err := api.NewCredentials(&b.Config.Machine.API)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- serveMetrics(ctx, creds, reg, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serveMetrics() = %v after shutdown, want nil", err)
		}
	}()

	body, err := scrape(b.Client, endpoint)
	if err != nil {
		t.Fatalf("scrape with the admin certificate: %v", err)
	}
	for _, want := range []string{"cairn_test_probe_total 3", "go_goroutines ", "process_resident_memory_bytes "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	other, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "other", Endpoints: []string{endpoint}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	foreign := *other.Client
	foreign.CA = b.Client.CA // trusts the node, but its certificate is of another CA
	if _, err := scrape(&foreign, endpoint); err == nil {
		t.Error("scrape with a certificate of another CA succeeded, want refused")
	}
	// The refusal is the TLS server's, for the certificate's issuer.
	if err := tlsprobe.HandshakeAndRead(&foreign, endpoint); err == nil || !strings.Contains(err.Error(), "tls: unknown certificate authority") {
		t.Errorf("TLS with a certificate of another CA: %v, want the server's unknown certificate authority alert", err)
	}
}

// scrape reads the metrics served at endpoint with cc's certificate.
func scrape(cc *machineconfig.ClientConfig, endpoint string) (string, error) {
	_, port, _ := net.SplitHostPort(endpoint)
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out strings.Builder
	err = client.Metrics(ctx, cc, endpoint, p, &out)
	return out.String(), err
}
