package stage2

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cairn-os/cairn/api/machine"
)

// TestResetRefused: a reset is refused, nothing planned, while an upgrade
// holds the boot entries, and with --wipe-state when STATE keeps no
// first-boot config (none here: the host has no STATE).
func TestResetRefused(t *testing.T) {
	dir := t.TempDir()
	b := newTestBoots(t, newESP(t, dir, "cairn-0.1.0.efi"), dir, "0.1.0")
	if err := b.lock("an upgrade to 0.2.0"); err != nil {
		t.Fatal(err)
	}
	n := &node{boots: b.boots}
	if _, err := n.reset(&machine.ResetRequest{}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "an upgrade to 0.2.0") {
		t.Errorf("reset during an upgrade = %v, want FailedPrecondition naming it", err)
	}
	if _, err := (&node{}).reset(&machine.ResetRequest{WipeState: true}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "first-boot config") {
		t.Errorf("reset --wipe-state without a first-boot config = %v, want FailedPrecondition", err)
	}
	if n.resetting != nil || len(b.reboots) != 0 {
		t.Errorf("a refused reset planned %v", n.resetting)
	}
}
