//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/qemu"
	"github.com/cairn-os/cairn/test/need"
	"github.com/diskfs/go-diskfs/partition/gpt"
)

// TestBrokenConfig boots a node whose machine config on STATE was damaged
// after the build: a field this Cairn does not know, as a config written by
// a newer one would have. The strict decoder refuses it, and PID 1 must not
// die of that: the node comes up in recovery mode, its network and
// management API from what can still be read of the file, and says why
// through the API (the boot timeline) and on the console. A reboot through
// the API (init's control socket) brings it back the same way; then QEMU's
// ACPI power button (system_powerdown) powers it off cleanly.
func TestBrokenConfig(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	cairn(t, "config", "gen", "--out", dir, "--hostname", "broken-node", "--endpoint", endpoint)
	disk := filepath.Join(dir, "node.raw")
	built := time.Now()
	cairn(t, "image", "build", "-c", filepath.Join(dir, "machine.yaml"), "-o", disk, "--assets", binDir)
	t.Logf("image built in %s", time.Since(built).Round(time.Second))
	editStateConfig(t, disk, func(cfg []byte) []byte { return append(cfg, "futureField: true\n"...) })
	c, _ := dialNode(t, dir, endpoint)

	vm := bootVM(t, qemu.Options{Disk: disk, APIPort: port})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ready := apiReady(c)
	start := time.Now()
	if err := vm.WaitReady(ctx, "the API in recovery mode", ready, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API ready in recovery mode %s after QEMU started (accel %s)", time.Since(start).Round(time.Second), vm.Accel())
	first := checkRecovery(t, ctx, c)
	out := cairn(t, "node", "--cairnconfig", filepath.Join(dir, "cairnconfig"), "version")
	if !strings.Contains(out, "load machine config  (failed: ") || !strings.Contains(out, "futureField") {
		t.Errorf("cairn node version printed:\n%s\nwant the load machine config step failed on futureField", out)
	}
	t.Logf("cairn node version:\n%s", out)

	// Reboot through the API, which asks init over its control socket:
	// the shutdown path of a node in recovery mode.
	if _, err := c.Reboot(ctx, &machine.RebootRequest{}); err != nil {
		t.Fatal(err)
	}
	rebooted := time.Now()
	for deadline := time.Now().Add(time.Minute); ready(ctx) == nil; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("API still answering a minute after Reboot")
		}
	}
	if err := vm.WaitReady(ctx, "the API in recovery mode after Reboot", ready, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API back %s after Reboot", time.Since(rebooted).Round(time.Second))
	if again := checkRecovery(t, ctx, c); again.Uptime.AsDuration() >= first.Uptime.AsDuration()+time.Since(start) {
		t.Errorf("after Reboot: uptime %s, want a fresh boot", again.Uptime.AsDuration())
	}

	// The ACPI power button.
	if err := vm.Powerdown(); err != nil {
		t.Fatal(err)
	}
	log := waitPoweredOff(t, vm, "the ACPI power button")
	for _, want := range []string{
		"cairn: ERROR the machine config cannot be loaded",
		`unknown field "futureField"`,
		"cairn: WARN recovery mode: hostname broken-node, the management API on port 50000",
		"cairn config validate",
		"cairn: shutdown requested by=control socket then=reboot",
		"cairn: bye then=reboot",
		"cairn: shutdown requested by=ACPI power button ",
		"cairn: bye then=power off",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("console log lacks %q", want)
		}
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "machine config") || strings.Contains(line, "recovery") || strings.Contains(line, "shut") ||
			strings.Contains(line, "ACPI") || strings.Contains(line, "bye") {
			t.Logf("console: %s", line)
		}
	}
	if strings.Contains(log, "panic recovered") || strings.Contains(log, "Kernel panic") {
		t.Errorf("console log tells of a panic:\n%s", log)
	}
}

// checkRecovery checks, through the API, a node in recovery mode from
// TestBrokenConfig's damage, and returns its Version.
func checkRecovery(t *testing.T, ctx context.Context, c *client.Client) *machine.VersionResponse {
	t.Helper()
	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Hostname != "broken-node" {
		t.Errorf("Version().Hostname = %q, want broken-node, read from the damaged config", v.Hostname)
	}
	steps := map[string]*machine.BootStep{}
	for _, s := range v.BootTimeline {
		steps[s.Name] = s
		t.Logf("boot step %8.3fs %7.3fs %s %s", s.Start.AsDuration().Seconds(), s.Duration.AsDuration().Seconds(), s.Name, s.Error)
	}
	load := steps["load machine config"]
	if load == nil || !strings.Contains(load.Error, `unknown field "futureField"`) || !strings.Contains(load.Error, "recovery mode") {
		t.Errorf("load machine config = %v, want it failed on the unknown field, saying the node is in recovery mode", load)
	}
	for _, name := range []string{"listen for the power button", "set hostname", "start services"} {
		if s := steps[name]; s == nil || s.Error != "" {
			t.Errorf("boot step %q = %v, want it done without error", name, s)
		}
	}
	// The DHCP of the default network: QEMU's user network leases this.
	waitRecovery(t, ctx, "the DHCP lease 10.0.2.15/24", func() bool {
		v, err := c.Version(ctx, &machine.VersionRequest{})
		return err == nil && slices.Contains(v.Addresses, "10.0.2.15/24")
	})
	// Only what the damaged config cannot break runs: containerd and the
	// agent, nothing the config asked for.
	waitRecovery(t, ctx, "containerd and cairn-agent Ready", func() bool {
		resp, err := c.Services(ctx, &machine.ServicesRequest{})
		if err != nil {
			return false
		}
		var ready []string
		for _, s := range resp.Services {
			if s.State == "Ready" {
				ready = append(ready, s.Name)
			}
		}
		return len(resp.Services) == 2 && len(ready) == 2
	})
	return v
}

// waitRecovery polls cond for up to two minutes.
func waitRecovery(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(time.Second) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("no %s after 2 minutes", what)
		}
	}
}

// editStateConfig rewrites config.yaml on the STATE partition of a raw
// disk image with edit's result, with debugfs (e2fsprogs) on the image
// file itself: as a hand edit or a newer Cairn would leave it.
func editStateConfig(t *testing.T, disk string, edit func([]byte) []byte) {
	t.Helper()
	debugfs := need.Tool(t, "debugfs", "e2fsprogs")
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	table, err := gpt.Read(f, 512, 512)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var fs string
	for _, p := range table.Partitions {
		if p.Name == "STATE" {
			fs = fmt.Sprintf("%s?offset=%d", disk, int64(p.Start)*512)
		}
	}
	if fs == "" {
		t.Fatalf("%s has no partition labelled STATE", disk)
	}
	run := func(args ...string) []byte {
		out, err := exec.Command(debugfs, args...).Output()
		if err != nil {
			t.Fatalf("debugfs %v: %v", args, err)
		}
		return out
	}
	old := run("-R", "cat /config.yaml", fs)
	if !bytes.Contains(old, []byte("kind: MachineConfig")) {
		t.Fatalf("STATE's config.yaml does not look like a machine config:\n%s", old)
	}
	edited := edit(old)
	tmp := filepath.Join(t.TempDir(), "config.yaml")
	script := filepath.Join(t.TempDir(), "edit.debugfs")
	if err := os.WriteFile(tmp, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	cmds := fmt.Sprintf("rm /config.yaml\nwrite %s /config.yaml\nsif /config.yaml mode 0100600\n", tmp)
	if err := os.WriteFile(script, []byte(cmds), 0o600); err != nil {
		t.Fatal(err)
	}
	run("-w", "-f", script, fs)
	// debugfs exits 0 even when a command fails: read the file back.
	if got := run("-R", "cat /config.yaml", fs); !bytes.Equal(got, edited) {
		t.Fatalf("STATE's config.yaml after the edit is\n%s\nwant\n%s", got, edited)
	}
}
