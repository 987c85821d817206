package vmtest

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-os/cairn/rootfs"
	"github.com/cairn-os/cairn/test/vmtest/internal/protocol"
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

// TestConsoleLines feeds a guest's console in pieces that split lines.
func TestConsoleLines(t *testing.T) {
	console := "[    1.0] kernel says\r\n=== RUN   TestA\r\n    --- SKIP: TestA/sub (0.00s)\r\n--- SKIP: TestA (0.00s)\r\nPASS\r\n\r\n" +
		protocol.ResultPrefix + "PASS\r\n[    2.0] reboot: Power down"
	var logged []string
	c := &consoleLines{log: func(s string) { logged = append(logged, s) }}
	for i := 0; i < len(console); i += 7 {
		c.add([]byte(console[i:min(i+7, len(console))]))
	}
	c.end()
	want := []string{
		"guest: [    1.0] kernel says", "guest: === RUN   TestA", "guest:     --- SKIP: TestA/sub (0.00s)",
		"guest: --- SKIP: TestA (0.00s)", "guest: PASS", "guest: ", "guest: " + protocol.ResultPrefix + "PASS",
		"guest: [    2.0] reboot: Power down",
	}
	if diff := cmp.Diff(want, logged); diff != "" {
		t.Errorf("logged lines (-want +got):\n%s", diff)
	}
	if c.result != "PASS" || c.skip != "--- SKIP: TestA (0.00s)" {
		t.Errorf("result %q, skip %q; want PASS and TestA's skip", c.result, c.skip)
	}
}

// TestBzPayloadRefuses checks what is not an xz kernel in a bzImage: the
// real kernel's payload is tested by booting it (TestGuestFailureFailsTheTest).
func TestBzPayloadRefuses(t *testing.T) {
	header := func(payloadLen uint32, payload string) []byte {
		bz := make([]byte, 5*512)
		copy(bz[0x202:], "HdrS")
		bz[0x1f1] = 4
		binary.LittleEndian.PutUint32(bz[0x248:], 0)
		binary.LittleEndian.PutUint32(bz[0x24c:], payloadLen)
		return append(bz, payload...)
	}
	for name, bz := range map[string][]byte{
		"no setup header":       make([]byte, 4096),
		"payload out of bounds": header(100, "\xfd7zXZ\x00"),
		"gzip payload":          header(4, "\x1f\x8b\x08\x00"),
	} {
		if _, err := bzPayload(bz); err == nil {
			t.Errorf("bzPayload(%s) = nil error, want one", name)
		}
	}
	if p, err := bzPayload(header(7, "\xfd7zXZ\x00!tail")); err != nil || string(p) != "\xfd7zXZ\x00!" {
		t.Errorf("bzPayload() = %q, %v; want the 7 bytes of the xz payload", p, err)
	}
}
