package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cairn-os/cairn/agent/api"
	"github.com/cairn-os/cairn/agent/drain"
	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/poll"
)

// TestAPICredentialsFollowRunningConfig serves the management API with
// the credentials of the running config, then replaces the file as init
// does when a config with new machine.api credentials is applied live:
// new connections get the new certificate and CA, so that a client of
// the old CA is refused and one of the new CA served.
func TestAPICredentialsFollowRunningConfig(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := l.Addr().String()
	gen := func(host string) *machineconfig.Bundle {
		b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: host, Endpoints: []string{endpoint}, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	old, next := gen("old"), gen("next")
	path := filepath.Join(t.TempDir(), "config.yaml")
	write := func(cfg *machineconfig.Config) {
		data, err := cfg.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(old.Config)
	creds, err := api.NewCredentials(&old.Config.Machine.API)
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewServer(creds, nil, drain.New(filepath.Join(t.TempDir(), "drain.json"), slog.Default()), t.TempDir())
	go srv.Serve(l)
	defer srv.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- followAPICredentials(ctx, path, creds, old.Config.Machine.API) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("followAPICredentials() = %v, want nil once stopped", err)
		}
	}()

	// call makes one call on a new connection with the client config of b.
	call := func(b *machineconfig.Bundle) error {
		c, err := client.Dial(b.Client, endpoint)
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = c.Audit(ctx, &machine.AuditRequest{})
		return err
	}
	if err := call(old); err != nil {
		t.Fatalf("the old client before the change: %v", err)
	}
	write(next.Config)
	poll.Until(t, 10*time.Second, "the new credentials served", func() error {
		if err := call(next); err != nil {
			return fmt.Errorf("the new client: %w", err)
		}
		return nil
	})
	if err := call(old); err == nil {
		t.Error("a client of the old CA is still served after the change")
	}
}
