package supervisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReaper runs the reaper in a child process made a subreaper, so
// orphans come to it as they would to PID 1, and no other test's children
// are reaped by mistake.
func TestReaper(t *testing.T) {
	if os.Getenv("CAIRN_REAPER_CHILD") == "1" {
		reaperChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReaper$", "-test.v")
	cmd.Env = append(os.Environ(), "CAIRN_REAPER_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("reaper child: %v\n%s", err, out)
	}
}

func reaperChild(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	r := NewReaper()
	// A process that exits at once: its status must reach the waiter.
	exits, err := r.Start(exec.Command("/bin/sh", "-c", "exit 7"))
	if err != nil {
		t.Fatal(err)
	}
	if e := <-exits; e.Status.ExitStatus() != 7 {
		t.Errorf("exit = %s, want exit status 7", e)
	}
	// A process that leaves orphans behind: they must be reaped too.
	if err := r.Run(exec.Command("/bin/sh", "-c", "for i in 1 2 3; do sleep 0.1 & done; exit 0")); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(exec.Command("/bin/sh", "-c", "exit 2")); err == nil {
		t.Error("Run(exit 2) = nil, want an error")
	}
	waitFor(t, "no children left", func() bool { return len(children(t)) == 0 })
}

// children lists the PIDs whose parent is this process, zombies included.
func children(t *testing.T) []string {
	self := strconv.Itoa(os.Getpid())
	var kids []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, s := range stats {
		raw, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
		if len(f) > 1 && f[1] == self {
			kids = append(kids, s)
		}
	}
	return kids
}
