package stage2

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
)

// TestMaintenance serves maintenance mode on loopback and applies to it
// through the client that trusts it by fingerprint: another fingerprint
// is refused before anything is sent, an invalid config with its field
// paths and nothing written, the first valid one written to STATE with a
// reboot, and a second refused.
func TestMaintenance(t *testing.T) {
	cert, fingerprint, err := selfSigned("test")
	if err != nil {
		t.Fatal(err)
	}
	if len(fingerprint) != 64 {
		t.Fatalf("fingerprint %q, want 64 hex digits", fingerprint)
	}
	dir := t.TempDir()
	reboots := make(chan struct{}, 2)
	m := &maintenance{statePath: filepath.Join(dir, "config.yaml"), firstBootPath: filepath.Join(dir, "first-boot.yaml"),
		reboot: func() { reboots <- struct{}{} }}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- m.serve(ctx, l, cert) }()
	defer func() { cancel(); <-served }()

	valid, invalid := firstConfigs(t, "maintained")
	apply := func(fp string, config []byte) error {
		c, err := client.DialFingerprint(l.Addr().String(), fp)
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = c.ApplyConfig(ctx, &machine.ApplyConfigRequest{Config: config, Mode: machine.ApplyMode_APPLY_MODE_REBOOT})
		return err
	}
	read := func(name string) string { b, _ := os.ReadFile(filepath.Join(dir, name)); return string(b) }

	other := strings.Repeat("0", 64)
	if err := apply(other, valid); err == nil || !strings.Contains(err.Error(), "not the node of that console") || read("config.yaml") != "" {
		t.Errorf("apply with another fingerprint: %v, STATE %q; want refused by the client", err, read("config.yaml"))
	}
	if _, err := client.DialFingerprint(l.Addr().String(), "abc"); err == nil {
		t.Error("DialFingerprint took a fingerprint of 3 digits")
	}
	err = apply(fingerprint, invalid)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "machine.hostname") || read("config.yaml") != "" {
		t.Errorf("apply of an invalid config: %v, STATE %q; want InvalidArgument naming machine.hostname, nothing written", err, read("config.yaml"))
	}
	if err := apply(fingerprint, valid); err != nil {
		t.Fatalf("apply of a valid config: %v", err)
	}
	if read("config.yaml") != string(valid) || read("first-boot.yaml") != string(valid) {
		t.Error("the applied config is not STATE's config.yaml and first-boot.yaml")
	}
	select {
	case <-reboots:
	case <-time.After(5 * time.Second):
		t.Error("no reboot after the config was applied")
	}
	if err := apply(fingerprint, valid); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a second apply: %v, want FailedPrecondition", err)
	}
	if len(reboots) != 0 {
		t.Error("a second apply rebooted again")
	}

	// The reboot stops the server at once, as the node's shutdown does:
	// the reply still reaches the client.
	t.Run("reply before the reboot", func(t *testing.T) {
		dir := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		m := &maintenance{statePath: filepath.Join(dir, "config.yaml"), firstBootPath: filepath.Join(dir, "first-boot.yaml"), reboot: cancel}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- m.serve(ctx, l, cert) }()
		c, err := client.DialFingerprint(l.Addr().String(), fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer acancel()
		if resp, err := c.ApplyConfig(actx, &machine.ApplyConfigRequest{Config: valid, Mode: machine.ApplyMode_APPLY_MODE_REBOOT}); err != nil || resp.Outcome != "rebooting" {
			t.Errorf("apply that stops the server: %v, %v; want the reply rebooting", resp, err)
		}
		<-served
	})
}
