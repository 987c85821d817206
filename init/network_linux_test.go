package main

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/machineconfig"
)

// TestWaitLeasesBounded returns as soon as every lease is in, and at the
// deadline when one never comes.
func TestWaitLeasesBounded(t *testing.T) {
	ifaces := []machineconfig.Interface{{Name: "eth0", DHCP: true}, {Name: "eth1"}, {Name: "eth2", DHCP: true}}
	done := func(err error) <-chan error {
		ch := make(chan error, 1)
		ch <- err
		return ch
	}
	start := time.Now()
	waitLeases([]<-chan error{done(nil), nil, done(errors.New("no lease"))}, ifaces, start.Add(time.Minute))
	if took := time.Since(start); took > time.Second {
		t.Errorf("waitLeases with every lease in took %s, want it at once", took)
	}
	start = time.Now()
	waitLeases([]<-chan error{make(chan error), nil, done(nil)}, ifaces, start.Add(200*time.Millisecond))
	if took := time.Since(start); took < 200*time.Millisecond || took > 2*time.Second {
		t.Errorf("waitLeases with a lease that never comes took %s, want the 200ms to the deadline", took)
	}
}

// TestAddRecordInOrder puts a background record among the boot steps by
// its start.
func TestAddRecordInOrder(t *testing.T) {
	n := &node{timeline: []boot.Record{{Name: "configure network", Start: 10}, {Name: "start services", Start: 30}}}
	n.addRecord(boot.Record{Name: "DHCP on eth1", Start: 20, Duration: 100})
	n.addRecord(boot.Record{Name: "late", Start: 40})
	var names []string
	for _, r := range n.timeline {
		names = append(names, r.Name)
	}
	want := []string{"configure network", "DHCP on eth1", "start services", "late"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("timeline mismatch (-want +got):\n%s", diff)
	}
}
