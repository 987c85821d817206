//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/qemu"
)

// ephemeralMade is init's console line when it makes EPHEMERAL.
const ephemeralMade = "EPHEMERAL partition created"

// testReset resets the node with --wipe-state through the CLI as admin:
// the next boot makes EPHEMERAL anew (init says so on the console) and
// runs on the image's machine config (first is Version at the first boot)
// with nothing of the configs applied since; an operator is refused.
func testReset(t *testing.T, ctx context.Context, c *client.Client, vm *qemu.VM, ready func(context.Context) error, cairnconfig, operatorConfig string, first *machine.VersionResponse) {
	made := func() int {
		log, err := os.ReadFile(vm.Opts.ConsoleLog)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(log), ephemeralMade)
	}
	before := made()
	if before != 1 {
		t.Fatalf("console log has %q %d times before the reset, want once (the first boot)", ephemeralMade, before)
	}
	if out, err := cairnCLI(ctx, "node", "--cairnconfig", operatorConfig, "reset"); err == nil || !strings.Contains(out, "PermissionDenied") {
		t.Errorf("reset as an operator: %v\n%s; want PermissionDenied", err, out)
	}
	if got, err := readNode(ctx, c, "/proc/sys/vm/swappiness"); err != nil || got == "60" {
		t.Fatalf("vm.swappiness before the reset = %q, %v; want an applied value, not the kernel's 60", got, err)
	}
	// Graceful: drained first; a node may not delete its own Node.
	// Right after the rollback that comes before, the agent may not have
	// joined its cluster again: the node refuses a graceful reset until it
	// has, so the call is repeated for up to two minutes.
	var out string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Second) {
		var err error
		out, err = cairnCLI(ctx, "node", "--cairnconfig", cairnconfig, "reset", "--wipe-state", "--graceful", "--drain-timeout", "2m")
		if err == nil {
			break
		}
		if !strings.Contains(out, "not in its cluster now") || time.Now().After(deadline) {
			t.Fatalf("reset --wipe-state --graceful: %v\n%s", err, out)
		}
	}
	for _, want := range []string{"drained; the Node e2e-node stays, cordoned: the cluster does not let a node delete its own Node", "wiping EPHEMERAL and STATE, then rebooting"} {
		if !strings.Contains(out, want) {
			t.Errorf("reset --wipe-state --graceful printed %q, want %q in it", out, want)
		}
	}
	awayAndBack(t, ctx, vm, ready, "the reset")
	if got := made(); got != before+1 {
		t.Errorf("console log has %q %d times after the reset, want %d: EPHEMERAL made anew", ephemeralMade, got, before+1)
	}
	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Config.Generation != first.Config.Generation || v.Boot.GetRolledBackFrom() != "" {
		t.Errorf("after the reset: config %v, boot %v; want the first boot's generation %d and no upgrade record", v.Config, v.Boot, first.Config.Generation)
	}
	if got, err := readNode(ctx, c, "/proc/sys/vm/swappiness"); err != nil || got != "60" {
		t.Errorf("vm.swappiness after the reset = %q, %v; want the kernel's 60: no applied config left", got, err)
	}
	if _, err := readNode(ctx, c, appliedFile); err == nil {
		t.Errorf("%s is still there after the reset", appliedFile)
	}
}
