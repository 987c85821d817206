package api

import (
	"context"
	"slices"
	"testing"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
)

// TestEvents merges init's events with the audit records, by time, for an
// operator; a reader gets init's alone.
func TestEvents(t *testing.T) {
	b, endpoint := serve(t, &recordingInit{}, t.TempDir())
	op := clientWithRole(t, b, endpoint, machineconfig.RoleOperator)
	ctx := context.Background()
	if _, err := op.Reboot(ctx, &machine.RebootRequest{}); err != nil { // audited
		t.Fatal(err)
	}
	kinds := func(role string) []string {
		t.Helper()
		s, err := clientWithRole(t, b, endpoint, role).Events(ctx, &machine.EventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		events, err := recvAll(s)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range events {
			out = append(out, e.Kind+" "+e.Subject)
		}
		return out
	}
	if got, want := kinds(machineconfig.RoleOperator), []string{"step mount STATE", "service containerd", "audit Reboot"}; !slices.Equal(got, want) {
		t.Errorf("Events() as an operator = %q, want %q", got, want)
	}
	if got, want := kinds(machineconfig.RoleReader), []string{"step mount STATE", "service containerd"}; !slices.Equal(got, want) {
		t.Errorf("Events() as a reader = %q, want %q: no audit records", got, want)
	}
}
