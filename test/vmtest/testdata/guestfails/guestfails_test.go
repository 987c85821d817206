// Package guestfails holds a test that fails on purpose in the VM, for
// vmtest's own test.
package guestfails

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/rootfs"
	"github.com/cairn-os/cairn/test/vmtest"
)

// TestInVM reports the kernel it runs on and whether bonding is loaded,
// then fails.
func TestInVM(t *testing.T) {
	if !vmtest.Run(t, vmtest.Options{Modules: []string{"bonding"}}) {
		return
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	_, err := os.Stat("/sys/module/bonding")
	t.Logf("kernel %s, pid %d, bonding loaded: %v", release, os.Getpid(), err == nil)
	if release != rootfs.KernelRelease {
		t.Errorf("kernel %s, want %s", release, rootfs.KernelRelease)
	}
	t.Error("failing on purpose")
}
