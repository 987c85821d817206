//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/qemu"
)

// TestBoot builds an image with a non-default hostname and a static
// address, boots it, and checks the node through its API only.
func TestBoot(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	buildImage(t, dir, "--hostname", "e2e-node", "--interface", "eth0",
		"--address", "10.0.2.15/24", "--gateway", "10.0.2.2", "--nameserver", "10.0.2.3",
		"--endpoint", endpoint)

	cc, err := machineconfig.LoadClientConfig(filepath.Join(dir, "cairnconfig"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(cc, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	vm, err := qemu.Start(qemu.Options{Disk: filepath.Join(dir, "node.raw"), APIPort: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-vm.Done():
		default:
			vm.Kill()
		}
		if t.Failed() {
			log, _ := os.ReadFile(vm.Opts.ConsoleLog)
			t.Logf("console log:\n%s", log)
		}
	})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := vm.WaitReady(ctx, func(ctx context.Context) error {
		_, err := c.Version(ctx, &machine.VersionRequest{})
		return err
	}, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API ready %s after QEMU started (accel %s)", time.Since(start).Round(time.Second), vm.Accel)

	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Hostname != "e2e-node" {
		t.Errorf("Version().Hostname = %q, want e2e-node", v.Hostname)
	}
	if !slices.Contains(v.Addresses, "10.0.2.15/24") {
		t.Errorf("Version().Addresses = %v, want 10.0.2.15/24 among them", v.Addresses)
	}
	if !strings.HasPrefix(v.Kernel, "6.1.") {
		t.Errorf("Version().Kernel = %q, want the pinned Debian 6.1 kernel", v.Kernel)
	}
	checkTimeline(t, v.BootTimeline)

	t.Run("CLI", func(t *testing.T) {
		out := cairn(t, "node", "--cairnconfig", filepath.Join(dir, "cairnconfig"), "version")
		if !strings.Contains(out, "e2e-node") || !strings.Contains(out, "mount STATE") {
			t.Errorf("cairn node version printed:\n%s\nwant the hostname and the boot timeline", out)
		}
	})

	t.Run("ForeignCARefused", func(t *testing.T) {
		other, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "other", Endpoints: []string{endpoint}, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		oc, err := client.Dial(other.Client, endpoint)
		if err != nil {
			t.Fatal(err)
		}
		defer oc.Close()
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		if _, err := oc.Version(cctx, &machine.VersionRequest{}); err == nil {
			t.Error("Version with a client certificate from another CA succeeded, want it refused")
		} else {
			t.Logf("refused as expected: %v", err)
		}
	})

	t.Run("Shutdown", func(t *testing.T) {
		if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		select {
		case <-vm.Done():
			t.Logf("QEMU exited %s after Shutdown", time.Since(stopped).Round(100*time.Millisecond))
		case <-time.After(60 * time.Second):
			t.Fatal("QEMU still running 60s after Shutdown")
		}
		log, err := os.ReadFile(vm.Opts.ConsoleLog)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"cairn: boot done", "cairn: shutting down then=power off", "cairn: bye then=power off"} {
			if !strings.Contains(string(log), want) {
				t.Errorf("console log lacks %q", want)
			}
		}
	})
}

// checkTimeline wants every boot step of both stages, in order, the network
// and config steps without error.
func checkTimeline(t *testing.T, steps []*machine.BootStep) {
	t.Helper()
	var names []string
	var last time.Duration
	for _, s := range steps {
		names = append(names, s.Name)
		if s.Start.AsDuration() < last {
			t.Errorf("boot step %q starts at %s, before the previous one (%s)", s.Name, s.Start.AsDuration(), last)
		}
		last = s.Start.AsDuration()
		if s.Error != "" {
			t.Errorf("boot step %q failed: %s", s.Name, s.Error)
		}
		t.Logf("boot step %8.3fs %7.3fs %s", s.Start.AsDuration().Seconds(), s.Duration.AsDuration().Seconds(), s.Name)
	}
	for _, want := range []string{"mount root squashfs", "mount STATE", "load machine config", "configure network", "start services"} {
		if !slices.Contains(names, want) {
			t.Errorf("boot timeline %v lacks %q", names, want)
		}
	}
}
