package machineconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestGenerate(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name        string
		opts        GenerateOptions
		wantNetwork Network
		wantDNS     []string
		wantIPs     []string
		wantClient  []string
	}{
		{
			name:        "defaults",
			opts:        GenerateOptions{Hostname: "cairn-node", Now: now},
			wantNetwork: Network{Interfaces: []Interface{{DHCP: true}}},
			wantDNS:     []string{"cairn-node", "localhost"},
			wantIPs:     []string{"127.0.0.1", "::1"},
			wantClient:  []string{"127.0.0.1:50000"},
		},
		{
			name: "static",
			opts: GenerateOptions{
				Hostname:    "node-1",
				Interface:   "eth0",
				Addresses:   []string{"10.0.2.15/24", "fd00::15/64"},
				Gateway:     "10.0.2.2",
				Nameservers: []string{"10.0.2.3"},
				Endpoints:   []string{"10.0.2.15:50000", "node-1.example.com:50000", "127.0.0.1:50000"},
				Now:         now,
			},
			wantNetwork: Network{
				Interfaces: []Interface{{
					Name:      "eth0",
					Addresses: []string{"10.0.2.15/24", "fd00::15/64"},
					Routes:    []Route{{To: "0.0.0.0/0", Via: "10.0.2.2"}},
				}},
				Nameservers: []string{"10.0.2.3"},
			},
			wantDNS:    []string{"node-1", "localhost", "node-1.example.com"},
			wantIPs:    []string{"127.0.0.1", "::1", "10.0.2.15", "fd00::15"},
			wantClient: []string{"10.0.2.15:50000", "node-1.example.com:50000", "127.0.0.1:50000"},
		},
		{
			name: "IPv6 gateway",
			opts: GenerateOptions{
				Hostname:  "node-1",
				Addresses: []string{"fd00::15/64"},
				Gateway:   "fd00::1",
				Now:       now,
			},
			wantNetwork: Network{Interfaces: []Interface{{
				Addresses: []string{"fd00::15/64"},
				Routes:    []Route{{To: "::/0", Via: "fd00::1"}},
			}}},
			wantDNS:    []string{"node-1", "localhost"},
			wantIPs:    []string{"127.0.0.1", "::1", "fd00::15"},
			wantClient: []string{"127.0.0.1:50000"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Generate(tt.opts)
			if err != nil {
				t.Fatalf("Generate() = %v", err)
			}
			if diff := cmp.Diff(tt.wantNetwork, b.Config.Network); diff != "" {
				t.Errorf("Generate() network mismatch (-want +got):\n%s", diff)
			}
			if b.Config.Machine.Hostname != tt.opts.Hostname || b.Config.Machine.API.Port != DefaultAPIPort {
				t.Errorf("Generate() machine = %q port %d, want %q port %d",
					b.Config.Machine.Hostname, b.Config.Machine.API.Port, tt.opts.Hostname, DefaultAPIPort)
			}
			cert := mustParseCert(t, []byte(b.Config.Machine.API.Cert))
			var ips []string
			for _, ip := range cert.IPAddresses {
				ips = append(ips, ip.String())
			}
			if diff := cmp.Diff(tt.wantDNS, cert.DNSNames); diff != "" {
				t.Errorf("Generate() server DNS names mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantIPs, ips); diff != "" {
				t.Errorf("Generate() server IPs mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantClient, b.Client.Endpoints); diff != "" {
				t.Errorf("Generate() client endpoints mismatch (-want +got):\n%s", diff)
			}
			clientCert := mustParseCert(t, []byte(b.Client.Cert))
			if role, ok := RoleFromCert(clientCert); clientCert.Subject.CommonName != "admin" || role != RoleAdmin || !ok {
				t.Errorf("Generate() client CN %q role %q, %v, want %q, %q, true", clientCert.Subject.CommonName, role, ok, "admin", RoleAdmin)
			}
		})
	}
}

func TestGenerateErrors(t *testing.T) {
	tests := []struct {
		name string
		opts GenerateOptions
		want []string
	}{
		{
			name: "gateway without address",
			opts: GenerateOptions{Hostname: "node-1", Gateway: "10.0.2.2"},
			want: []string{"gateway 10.0.2.2 needs a static address"},
		},
		{
			name: "invalid options",
			opts: GenerateOptions{
				Hostname:  "Node_1",
				Addresses: []string{"10.0.2.300/24"},
				Gateway:   "gw",
				Endpoints: []string{"node-1"},
			},
			want: []string{
				"machine.hostname:",
				"network.interfaces[0].addresses[0]:",
				"network.interfaces[0].routes[0].via:",
				"endpoints[0]:",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Generate(tt.opts)
			if err == nil {
				t.Fatalf("Generate() = nil error, want an error containing %q", tt.want)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Generate() = %v, want an error containing %q", err, want)
				}
			}
		})
	}
}

func TestBundleWriteLoad(t *testing.T) {
	b, err := Generate(GenerateOptions{Hostname: "node-1"})
	if err != nil {
		t.Fatalf("Generate() = %v", err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	if err := b.Write(dir, false); err != nil {
		t.Fatalf("Write() = %v", err)
	}
	for name, want := range map[string]os.FileMode{
		MachineConfigFile: 0o600,
		CACertFile:        0o644,
		CAKeyFile:         0o600,
		ClientConfigFile:  0o600,
	} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("Write() did not write %s: %v", name, err)
			continue
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("Write() %s mode = %v, want %v", name, got, want)
		}
	}

	cfg, err := Load(filepath.Join(dir, MachineConfigFile))
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	if diff := cmp.Diff(b.Config, cfg); diff != "" {
		t.Errorf("Load(Write()) mismatch (-want +got):\n%s", diff)
	}
	client, err := LoadClientConfig(filepath.Join(dir, ClientConfigFile))
	if err != nil {
		t.Fatalf("LoadClientConfig() = %v", err)
	}
	if diff := cmp.Diff(b.Client, client); diff != "" {
		t.Errorf("LoadClientConfig(Write()) mismatch (-want +got):\n%s", diff)
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(certPEM, keyPEM); err != nil {
		t.Errorf("LoadCA(written files) = %v", err)
	}

	if err := b.Write(dir, false); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Write() over existing files = %v, want fs.ErrExist", err)
	}
	if err := b.Write(dir, true); err != nil {
		t.Errorf("Write(force) = %v", err)
	}
}

// handshake runs a TLS handshake over an in-memory connection and returns
// the server's and the client's errors and the client certificate the
// server saw.
func handshake(t *testing.T, server, client *tls.Config) (serverErr, clientErr error, peer *x509.Certificate) {
	t.Helper()
	sc, cc := net.Pipe()
	deadline := time.Now().Add(10 * time.Second)
	sc.SetDeadline(deadline)
	cc.SetDeadline(deadline)

	type result struct {
		err  error
		peer *x509.Certificate
	}
	done := make(chan result, 1)
	go func() {
		// Close the raw connections: a TLS close_notify would block on the
		// unbuffered pipe.
		defer sc.Close()
		conn := tls.Server(sc, server)
		err := conn.Handshake()
		if err != nil {
			done <- result{err: err}
			return
		}
		_, err = conn.Write([]byte("ok"))
		done <- result{err: err, peer: conn.ConnectionState().PeerCertificates[0]}
	}()

	conn := tls.Client(cc, client)
	clientErr = conn.Handshake()
	if clientErr == nil {
		// In TLS 1.3 the client finishes its handshake before the server
		// checks the client certificate; a rejection shows up on read.
		_, clientErr = conn.Read(make([]byte, 2))
	}
	cc.Close()
	r := <-done
	return r.err, clientErr, r.peer
}

func TestMutualTLS(t *testing.T) {
	b, err := Generate(GenerateOptions{Hostname: "node-1", Addresses: []string{"10.0.2.15/24"}})
	if err != nil {
		t.Fatalf("Generate() = %v", err)
	}
	other, err := Generate(GenerateOptions{Hostname: "node-1"})
	if err != nil {
		t.Fatalf("Generate() = %v", err)
	}
	server, err := b.Config.Machine.API.TLSConfig()
	if err != nil {
		t.Fatalf("API.TLSConfig() = %v", err)
	}
	// A client that trusts b's CA but holds a certificate from another CA.
	stranger := *b.Client
	stranger.Cert, stranger.Key = other.Client.Cert, other.Client.Key

	// rejectedBy names the side that must refuse the peer's certificate;
	// empty means the handshake must succeed.
	tests := []struct {
		name       string
		client     *ClientConfig
		serverName string
		rejectedBy string
	}{
		{"hostname", b.Client, "node-1", ""},
		{"loopback", b.Client, "127.0.0.1", ""},
		{"static address", b.Client, "10.0.2.15", ""},
		{"name not in the certificate", b.Client, "node-2", "client"},
		{"server from another CA", other.Client, "node-1", "client"},
		{"client from another CA", &stranger, "node-1", "server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, err := tt.client.TLSConfig(tt.serverName)
			if err != nil {
				t.Fatalf("ClientConfig.TLSConfig() = %v", err)
			}
			serverErr, clientErr, peer := handshake(t, server, client)
			switch tt.rejectedBy {
			case "":
				if serverErr != nil || clientErr != nil {
					t.Fatalf("handshake: server error %v, client error %v, want success", serverErr, clientErr)
				}
				if role, ok := RoleFromCert(peer); role != RoleAdmin || !ok {
					t.Errorf("RoleFromCert(peer) = %q, %v, want %q, true", role, ok, RoleAdmin)
				}
			case "client":
				if clientErr == nil || !strings.Contains(clientErr.Error(), "failed to verify certificate") || serverErr == nil {
					t.Errorf("handshake: server error %v, client error %v, want the client to refuse the server certificate", serverErr, clientErr)
				}
			case "server":
				if serverErr == nil || !strings.Contains(serverErr.Error(), "failed to verify certificate") || clientErr == nil {
					t.Errorf("handshake: server error %v, client error %v, want the server to refuse the client certificate", serverErr, clientErr)
				}
			}
		})
	}
}

func TestTLSConfigMinVersion(t *testing.T) {
	b, err := Generate(GenerateOptions{Hostname: "node-1"})
	if err != nil {
		t.Fatalf("Generate() = %v", err)
	}
	server, err := b.Config.Machine.API.TLSConfig()
	if err != nil {
		t.Fatalf("API.TLSConfig() = %v", err)
	}
	client, err := b.Client.TLSConfig("")
	if err != nil {
		t.Fatalf("ClientConfig.TLSConfig() = %v", err)
	}
	for _, c := range []*tls.Config{server, client} {
		if c.MinVersion != tls.VersionTLS13 {
			t.Errorf("MinVersion = %x, want TLS 1.3", c.MinVersion)
		}
	}
	if server.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("server ClientAuth = %v, want RequireAndVerifyClientCert", server.ClientAuth)
	}
	if len(client.Certificates) != 1 || client.RootCAs == nil {
		t.Errorf("client config has %d certificates and RootCAs %v, want 1 and the CA", len(client.Certificates), client.RootCAs)
	}
}

// TestGenerateSharedCA generates the configs of two nodes with one CA, as
// `cairn qemu cluster` does: each node's API certificate is the CA's, and
// the client config of either is trusted by both.
func TestGenerateSharedCA(t *testing.T) {
	first, err := Generate(GenerateOptions{Hostname: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := Generate(GenerateOptions{Hostname: "node-2", CA: first.CA})
	if err != nil {
		t.Fatal(err)
	}
	if second.Config.Machine.API.CA != first.Config.Machine.API.CA {
		t.Fatal("node-2's API CA differs from the one it was given")
	}
	for _, b := range []*Bundle{first, second} {
		server, err := b.Config.Machine.API.TLSConfig()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []*ClientConfig{first.Client, second.Client} {
			client, err := c.TLSConfig(b.Config.Machine.Hostname)
			if err != nil {
				t.Fatal(err)
			}
			if serverErr, clientErr, _ := handshake(t, server, client); serverErr != nil || clientErr != nil {
				t.Errorf("%s: handshake: server error %v, client error %v, want success", b.Config.Machine.Hostname, serverErr, clientErr)
			}
		}
	}
}
