package stage2

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/supervisor"
)

// TestEvents reads init's events through the control socket: stage 1's
// steps and the boot's as the timeline gets them, the services' state
// changes, a shutdown asked for; the last few with tail; new ones as they
// come with follow.
func TestEvents(t *testing.T) {
	n := newNode(newFakeSystem().system(), []boot.Record{{Name: "mount the root", Start: time.Second, Duration: 100 * time.Millisecond}})
	n.timeline.Add(boot.Record{Name: "mount STATE", Start: 2 * time.Second, Duration: 20 * time.Millisecond, Err: "no partition labelled STATE"})
	changes := make(chan supervisor.Event, 2)
	changes <- supervisor.Event{Service: "containerd", State: supervisor.StateRunning, Time: time.Now()}
	changes <- supervisor.Event{Service: "containerd", State: supervisor.StateBackoff, Time: time.Now(), Reason: "exited with status 1"}
	close(changes)
	n.events.services(changes)
	c := controlClient(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	read := func(req *machine.EventsRequest) []string {
		t.Helper()
		s, err := c.Events(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for {
			e, err := s.Recv()
			if err == io.EOF {
				return out
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, e.Kind+" "+e.Subject+": "+e.Message)
		}
	}
	want := []string{
		"step mount the root: done in 100ms",
		"step mount STATE: failed after 20ms: no partition labelled STATE",
		"service containerd: " + string(supervisor.StateRunning),
		"service containerd: " + string(supervisor.StateBackoff) + ": exited with status 1",
	}
	if got := read(&machine.EventsRequest{}); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Events() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := read(&machine.EventsRequest{Tail: 1}); len(got) != 1 || got[0] != want[3] {
		t.Errorf("Events(tail 1) = %q, want the last one", got)
	}

	s, err := c.Events(ctx, &machine.EventsRequest{Follow: true, Tail: 1})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := s.Recv(); err != nil || e.Subject != "containerd" {
		t.Fatalf("first followed event = %v, %v; want the last kept", e, err)
	}
	n.events.add("config", "generation 2", "applied live (1 changes)")
	if e, err := s.Recv(); err != nil || e.Kind != "config" || e.Message != "applied live (1 changes)" {
		t.Errorf("followed event = %v, %v; want the config applied", e, err)
	}
}
