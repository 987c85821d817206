package stage2

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/machineconfig"
	"golang.org/x/sys/unix"
)

// Maintenance mode is how a node that found no machine config anywhere
// (STATE, cairn.config.url, a NoCloud volume) gets one: it serves the
// management API's ApplyConfig alone, on the API port, with a certificate
// it made at boot and whose fingerprint it prints on the console, to any
// client; the first valid config applied becomes its config, and it
// reboots on it. The client trusts the node by that fingerprint (`cairn
// node apply --insecure --fingerprint`), and the node trusts whoever
// reaches it first: maintenance mode is for a network the operator holds.
type maintenance struct {
	machine.UnimplementedMachineServer
	statePath, firstBootPath string
	reboot                   func()

	mu      sync.Mutex
	applied bool
}

// selfSigned makes the key and certificate of a maintenance server, and
// returns them with the certificate's fingerprint: the hex SHA-256 of its
// DER bytes.
func selfSigned(hostname string) (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "cairn maintenance " + hostname},
		NotBefore:    time.Now().Add(-time.Hour), // a clock not yet set may be behind
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	sum := sha256.Sum256(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, hex.EncodeToString(sum[:]), nil
}

// serve serves m on l until ctx ends, with the certificate cert.
func (m *maintenance) serve(ctx context.Context, l net.Listener, cert tls.Certificate) error {
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS13,
	})), grpc.UnaryInterceptor(recoverUnary))
	machine.RegisterMachineServer(srv, m)
	go func() {
		<-ctx.Done()
		// The reply to the apply that made the node reboot is still on
		// its way: it is let through.
		srv.GracefulStop()
	}()
	return srv.Serve(l)
}

// ApplyConfig takes the first valid machine config as the node's, and
// reboots on it.
func (m *maintenance) ApplyConfig(_ context.Context, req *machine.ApplyConfigRequest) (*machine.ApplyConfigResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.applied {
		return nil, status.Error(codes.FailedPrecondition, "maintenance mode: a machine config was applied already; the node reboots on it")
	}
	if req.Mode == machine.ApplyMode_APPLY_MODE_DRY_RUN {
		return nil, status.Error(codes.InvalidArgument, "maintenance mode: the node has no config to compare with; apply one")
	}
	if _, err := machineconfig.Parse(req.Config); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "maintenance mode: %v", err)
	}
	if err := keepFirstBootConfig(req.Config, m.statePath, m.firstBootPath); err != nil {
		return nil, status.Errorf(codes.Internal, "maintenance mode: write the config: %v", err)
	}
	m.applied = true
	slog.Info("maintenance mode: machine config applied, written to STATE: rebooting to boot on it")
	go m.reboot() // once the reply is on its way
	return &machine.ApplyConfigResponse{Outcome: "rebooting", Generation: 1}, nil
}

// maintenanceAdvice tells the operator on the console how to give a node
// in maintenance mode its config.
func maintenanceAdvice(fingerprint string, port int) string {
	return fmt.Sprintf("maintenance mode: no machine config on STATE, from cairn.config.url or a NoCloud volume; apply one with `cairn node apply --insecure --fingerprint %s -n NODE-IP:%d -f machine.yaml --mode reboot`", fingerprint, port)
}

// startMaintenance serves maintenance mode on port until the shutdown.
func (n *node) startMaintenance(port int) error {
	cert, fingerprint, err := selfSigned(machineconfig.RecoveryHostname)
	if err != nil {
		return fmt.Errorf("maintenance certificate: %w", err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("maintenance mode: %w", err)
	}
	m := &maintenance{statePath: layout.MachineConfig, firstBootPath: layout.FirstBootConfig,
		reboot: func() {
			n.requestShutdown(unix.LINUX_REBOOT_CMD_RESTART, "a machine config applied in maintenance mode")
		}}
	ctx, cancel := context.WithCancel(context.Background())
	boot.Go("stop maintenance mode at the shutdown", func() { <-n.stop; cancel() })
	boot.Go("maintenance mode", func() {
		if err := m.serve(ctx, l, cert); err != nil {
			slog.Error("maintenance mode", "err", err)
		}
	})
	slog.Warn(maintenanceAdvice(fingerprint, port), "fingerprint", fingerprint)
	n.events.add("config", "maintenance mode", "waiting for a machine config; certificate fingerprint "+fingerprint)
	return nil
}
