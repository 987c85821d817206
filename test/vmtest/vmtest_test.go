package vmtest

import (
	"strings"
	"testing"

	"github.com/cairn-os/cairn/rootfs"
)

// TestGuestFailureFailsTheTest boots testdata/guestfails, whose test
// fails on purpose in the VM, and checks that the host sees the failure
// and the guest's output: the Debian kernel ran it with bonding loaded.
func TestGuestFailureFailsTheTest(t *testing.T) {
	var console []string
	err := run(t, "testdata/guestfails", "^TestInVM$", Options{Modules: []string{"bonding"}}, func(s string) {
		t.Log(s)
		console = append(console, s)
	})
	if err == nil || !strings.Contains(err.Error(), "test binary: exit status 1") {
		t.Errorf("run() = %v, want the guest's test failed (test binary: exit status 1)", err)
	}
	out := strings.Join(console, "\n")
	for _, want := range []string{
		"kernel " + rootfs.KernelRelease + ", pid ",
		"bonding loaded: true",
		"failing on purpose",
		"--- FAIL: TestInVM",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the guest's console has no %q", want)
		}
	}
}

func TestTestPattern(t *testing.T) {
	for name, want := range map[string]string{
		"TestA":          "^TestA$",
		"TestA/sub_case": "^TestA$/^sub_case$",
		"TestA/x.y":      `^TestA$/^x\.y$`,
	} {
		if got := testPattern(name); got != want {
			t.Errorf("testPattern(%q) = %q, want %q", name, got, want)
		}
	}
}
