// Package nsrun makes network namespaces for a test, and runs its code in
// them.
package nsrun

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/cairn-os/cairn/internal/inns"
)

var seq atomic.Int32

// New makes a network namespace named after the test binary's pid and
// role, with its loopback up, and returns its name and a handle;
// t.Cleanup deletes it, and the links, routes and nftables tables made
// in it with it.
func New(t testing.TB, role string) (string, netns.NsHandle) {
	t.Helper()
	name := fmt.Sprintf("cairn-%d-%d-%s", os.Getpid(), seq.Add(1), role)
	IP(t, "netns", "add", name)
	h, err := netns.GetFromPath("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", name, err, out)
		}
	})
	IP(t, "-n", name, "link", "set", "lo", "up")
	return name, h
}

// IP runs ip(8) with args and fails the test if it fails.
func IP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// In runs f on the calling goroutine's thread, in network namespace h:
// the sockets it opens and the processes it starts live there. The thread
// returns to its own namespace afterwards.
func In(t testing.TB, h netns.NsHandle, f func()) {
	t.Helper()
	leave, err := inns.Enter(h)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := leave(); err != nil {
			panic(fmt.Sprintf("cannot return to the test's network namespace: %v", err))
		}
	}()
	f()
}
