// Package nsrun runs a test's code in a network namespace the test made.
package nsrun

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// In runs f on a thread in network namespace h: the sockets it opens and
// the processes it starts live there. The thread returns to its own
// namespace afterwards.
func In(t testing.TB, h netns.NsHandle, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("cannot return to the test's network namespace: %v", err))
		}
	}()
	f()
}
