package stage2

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/test/need"
)

// inNamespaces runs the calling test again, alone, in a child process in
// new namespaces (cloneflags, e.g. CLONE_NEWNET), and reports whether this
// is that child: the parent only checks how the child did. The whole
// process is in the namespaces, every thread included; in a new mount
// namespace the mounts are made private first, so none reaches the host.
func inNamespaces(t *testing.T, cloneflags uintptr) bool {
	t.Helper()
	if os.Getenv("CAIRN_NS_CHILD") == t.Name() {
		if cloneflags&syscall.CLONE_NEWNS != 0 {
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				t.Fatal(err)
			}
		}
		return true
	}
	need.Root(t, "namespaces")
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "CAIRN_NS_CHILD="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cloneflags}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in new namespaces: %v\n%s", t.Name(), err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s in new namespaces did not pass:\n%s", t.Name(), out)
	}
	return false
}

// TestSetHostname sets the hostname in a UTS namespace of the test's, and
// writes /etc/hostname and /etc/hosts on a tmpfs over /etc in a mount
// namespace of its own.
func TestSetHostname(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWUTS|syscall.CLONE_NEWNS) {
		return
	}
	if err := unix.Mount("tmpfs", "/etc", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatal(err)
	}
	if err := setHostname("node-1"); err != nil {
		t.Fatalf("setHostname() = %v", err)
	}
	if got, _ := os.Hostname(); got != "node-1" {
		t.Errorf("hostname %q, want node-1", got)
	}
	for file, want := range map[string]string{
		"/etc/hostname": "node-1\n",
		"/etc/hosts":    "127.0.0.1 localhost\n::1 localhost\n127.0.1.1 node-1\n",
	} {
		if got, err := os.ReadFile(file); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", file, got, err, want)
		}
	}
}
