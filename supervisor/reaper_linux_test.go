package supervisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/need"

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

	// Childless: at once with no child; after a child's exit was handed
	// on, with one.
	select {
	case <-r.Childless():
	case <-time.After(10 * time.Second):
		t.Fatal("Childless() not closed within 10s without a child")
	}
	exits, err = r.Start(exec.Command("/bin/sh", "-c", "sleep 0.2 & exit 0"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Childless():
	case <-time.After(10 * time.Second):
		t.Fatalf("Childless() not closed within 10s; children: %v", children(t))
	}
	if kids := children(t); len(kids) != 0 {
		t.Errorf("children %v when Childless() closed, want none", kids)
	}
	select {
	case <-exits:
	default:
		t.Error("Childless() closed before the child's exit was handed to its waiter")
	}
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

// TestOrphansReapedAsPID1 runs a Supervisor with the Reaper as PID 1 of a
// new PID namespace, as init runs it: a service that leaves orphans, and
// one with an exec readiness probe, must leave no zombie behind.
func TestOrphansReapedAsPID1(t *testing.T) {
	if os.Getenv("CAIRN_PID1_CHILD") == "1" {
		pid1Child(t)
		return
	}
	need.Root(t, "a new PID namespace")
	cmd := exec.Command(os.Args[0], "-test.run=^TestOrphansReapedAsPID1$", "-test.v")
	cmd.Env = append(os.Environ(), "CAIRN_PID1_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("PID 1 child: %v\n%s", err, out)
	}
}

func pid1Child(t *testing.T) {
	if pid := os.Getpid(); pid != 1 {
		t.Fatalf("Getpid() = %d, want 1", pid)
	}
	// A /proc of this namespace, seen by this mount namespace only.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		t.Fatal(err)
	}
	r := NewReaper()
	s := New(Options{Starter: r, Log: quietLog()})
	for _, svc := range []Service{
		{
			Name: "orphans", Path: "/bin/sh", Restart: RestartNever,
			Args: []string{"-c", "for i in 1 2 3; do sleep 0.2 & done; exit 0"},
		},
		{Name: "probed", Path: "/bin/sleep", Args: []string{"60"}, Ready: ExecProbe("/bin/true")},
	} {
		if err := s.Add(svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if st := waitState(t, s, "orphans", StateStopped); st.LastExit != "exit status 0" {
		t.Errorf("orphans: LastExit = %q, want %q", st.LastExit, "exit status 0")
	}
	waitState(t, s, "probed", StateReady)
	stop(t, s)
	if st := status(t, s, "probed"); st.LastExit != "killed by signal terminated" {
		t.Errorf("probed: LastExit = %q, want %q", st.LastExit, "killed by signal terminated")
	}
	// Nothing but this process is left: every orphan was reaped.
	waitFor(t, "only PID 1 left", func() bool {
		procs, _ := filepath.Glob("/proc/[0-9]*")
		return len(procs) == 1
	})
}
