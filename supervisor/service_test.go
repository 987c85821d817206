package supervisor

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestBackoffNext(t *testing.T) {
	b := DefaultBackoff
	tests := []struct {
		name      string
		prev, ran time.Duration
		want      time.Duration
	}{
		{"first restart", 0, time.Millisecond, time.Second},
		{"doubles", time.Second, time.Millisecond, 2 * time.Second},
		{"doubles again", 8 * time.Second, time.Second, 16 * time.Second},
		{"capped", 16 * time.Second, time.Second, 30 * time.Second},
		{"stays capped", 30 * time.Second, time.Second, 30 * time.Second},
		{"reset after a healthy minute", 30 * time.Second, time.Minute, time.Second},
	}
	for _, tt := range tests {
		if got := b.next(tt.prev, tt.ran); got != tt.want {
			t.Errorf("%s: next(%s, %s) = %s, want %s", tt.name, tt.prev, tt.ran, got, tt.want)
		}
	}
}

func newTestSupervisor() *Supervisor {
	s := New(DirectStarter{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.backoff = Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond, Reset: time.Minute}
	return s
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestCrashingServiceIsRestarted(t *testing.T) {
	runs := filepath.Join(t.TempDir(), "runs")
	s := newTestSupervisor()
	if err := s.Start(Service{Name: "crasher", Path: "/bin/sh", Args: []string{"-c", "echo run >> " + runs + "; exit 3"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "three runs", func() bool {
		raw, _ := os.ReadFile(runs)
		return strings.Count(string(raw), "run") >= 3
	})
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.State("crasher"); st != StateStopped {
		t.Errorf("State(crasher) after Stop = %s, want %s", st, StateStopped)
	}
}

func TestNeverPolicyLeavesFailed(t *testing.T) {
	s := newTestSupervisor()
	s.Start(Service{Name: "once", Path: "/bin/sh", Args: []string{"-c", "exit 1"}, Restart: RestartNever})
	waitFor(t, "Failed", func() bool { st, _ := s.State("once"); return st == StateFailed })
	s.Stop(context.Background())
}

func TestMissingBinaryBacksOff(t *testing.T) {
	s := newTestSupervisor()
	s.Start(Service{Name: "missing", Path: "/nonexistent/binary"})
	waitFor(t, "Backoff", func() bool { st, _ := s.State("missing"); return st == StateBackoff })
	s.Stop(context.Background())
}

func TestStopKillsProcessIgnoringSIGTERM(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	s := newTestSupervisor()
	// The shell ignores SIGTERM and so does its child: only SIGKILL of the
	// whole group ends them.
	s.Start(Service{
		Name: "stubborn", Path: "/bin/sh",
		Args:        []string{"-c", "trap '' TERM; sleep 60 & echo $! > " + pidFile + "; wait"},
		StopTimeout: 200 * time.Millisecond,
	})
	waitFor(t, "child pid", func() bool { raw, _ := os.ReadFile(pidFile); return len(raw) > 0 })
	raw, _ := os.ReadFile(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "grandchild gone", func() bool {
		return syscall.Kill(pid, 0) == syscall.ESRCH || isZombie(pid)
	})
}

func isZombie(pid int) bool {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}
