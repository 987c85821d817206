package inns_test

import (
	"context"
	"net"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/cairn-os/cairn/internal/inns"
	"github.com/cairn-os/cairn/test/nsrun"
)

// TestDoAndDialer listens in a new network namespace, from Do, on an
// address that exists only there, and connects to it with Dialer; the
// same address cannot be reached from the test's own namespace, and the
// calling thread's namespace is left as it was.
func TestDoAndDialer(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	name, _ := nsrun.New(t, "inns")
	nsrun.IP(t, "-n", name, "addr", "add", "192.0.2.1/32", "dev", "lo")
	var l net.Listener
	if err := inns.Do(name, func() error {
		l, err = net.Listen("tcp", "192.0.2.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("x"))
			c.Close()
		}
	}()
	c, err := inns.Dialer(name)(context.Background(), "tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("dial %s in %s: %v", l.Addr(), name, err)
	}
	b := make([]byte, 1)
	if _, err := c.Read(b); err != nil || b[0] != 'x' {
		t.Errorf("read %q, %v from the namespace's listener, want x", b, err)
	}
	c.Close()

	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !after.Equal(before) {
		t.Error("the test's thread changed network namespace")
	}
	if out, err := exec.Command("ip", "-o", "addr", "show", "to", "192.0.2.1").Output(); err != nil || len(out) != 0 {
		t.Errorf("192.0.2.1 in the host's namespace: %q, %v; want it only in %s", out, err, name)
	}
	if err := inns.Do("cairn-no-such-namespace", func() error { return nil }); err == nil {
		t.Error("Do in a namespace that does not exist succeeded")
	}
}
