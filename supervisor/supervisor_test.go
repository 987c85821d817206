package supervisor

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRestartBackoffJitter checks the restart schedule's spread: each
// delay between the doubling delay and a fifth more.
func TestRestartBackoffJitter(t *testing.T) {
	b := restartBackoff
	for i, base := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		if got := b.Next(); got < base || got > base+base/5 {
			t.Errorf("restart delay #%d = %s, want within [%s, %s]", i+1, got, base, base+base/5)
		}
	}
}

// TestCrashLoopBacksOff drives a crashing service with a fake clock: the
// delays before each restart double from 1 s to 30 s, and go back to 1 s
// after a run that lasted a minute (without jitter, to see the schedule).
func TestCrashLoopBacksOff(t *testing.T) {
	dir := t.TempDir()
	hold := filepath.Join(dir, "hold")
	clock := newFakeClock()
	s := New(Options{Clock: clock, Log: quietLog()})
	s.restartBackoff.Jitter = 0
	err := s.Add(Service{
		Name: "crasher", Path: "/bin/sh",
		Args: []string{"-c", `while [ -e "$1" ]; do sleep 0.01; done; exit 3`, "sh", hold},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)

	var delays []time.Duration
	for range 8 {
		d := clock.waitTimer(t)
		delays = append(delays, d)
		st := status(t, s, "crasher")
		if st.State != StateBackoff || st.Reason != "exit status 3" {
			t.Errorf("after %d runs: State, Reason = %s, %q, want %s, %q", len(delays), st.State, st.Reason, StateBackoff, "exit status 3")
		}
		if st.Restarts != len(delays)-1 {
			t.Errorf("after %d runs: Restarts = %d, want %d", len(delays), st.Restarts, len(delays)-1)
		}
		if len(delays) == 8 {
			// The next run lasts a healthy minute.
			if err := os.WriteFile(hold, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(d)
	}
	waitState(t, s, "crasher", StateReady)
	clock.Advance(time.Minute)
	os.Remove(hold)
	delays = append(delays, clock.waitTimer(t))

	s1, s2, s4, s8, s16, s30 := time.Second, 2*time.Second, 4*time.Second, 8*time.Second, 16*time.Second, 30*time.Second
	want := []time.Duration{s1, s2, s4, s8, s16, s30, s30, s30, s1}
	if diff := cmp.Diff(want, delays); diff != "" {
		t.Errorf("backoff delays (-want +got):\n%s", diff)
	}
}

// TestDependencies starts b, which depends on a, whose readiness is a unix
// socket it opens after a delay: b must start only once the socket accepts,
// and stop before a.
func TestDependencies(t *testing.T) {
	dir := t.TempDir()
	sock, seen := filepath.Join(dir, "a.sock"), filepath.Join(dir, "seen")
	s := New(Options{Log: quietLog()})
	events, cancel := s.Subscribe()
	defer cancel()
	// Added dependent first, so the order comes from DependsOn alone.
	b := Service{
		Name: "b", Path: "/bin/sh", DependsOn: []string{"a"},
		Args: []string{"-c", `if [ -S "$1" ]; then echo socket > "$2"; else echo none > "$2"; fi; exec sleep 60`, "sh", sock, seen},
	}
	for _, svc := range []Service{b, listener("a", sock, 300*time.Millisecond)} {
		if err := s.Add(svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	var raw []byte
	waitFor(t, "b to look for the socket", func() bool {
		raw, _ = os.ReadFile(seen)
		return bytes.HasSuffix(raw, []byte("\n"))
	})
	if string(raw) != "socket\n" {
		t.Errorf("b saw %q when it started, want %q", raw, "socket\n")
	}
	stop(t, s)

	var all []string
	got := map[string][]string{}
	for e := range events {
		all = append(all, e.Service+" "+string(e.State))
		got[e.Service] = append(got[e.Service], string(e.State)+" "+e.Reason)
		if e.Service == "a" && e.State == StateStopped {
			break
		}
	}
	want := map[string][]string{
		"a": {"Waiting ", "Starting ", "Running ", "Ready ", "Stopping stop requested", "Stopped "},
		"b": {"Waiting ", "Waiting waiting for a", "Starting ", "Running ", "Ready ", "Stopping stop requested", "Stopped "},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	for _, order := range [][2]string{{"a Ready", "b Starting"}, {"b Stopped", "a Stopping"}} {
		if i, j := slices.Index(all, order[0]), slices.Index(all, order[1]); i > j {
			t.Errorf("%q came after %q, want before; events: %q", order[0], order[1], all)
		}
	}
}

// TestStopBefore stops a service that says it stops before another only
// after it, though neither waited for the other to start.
func TestStopBefore(t *testing.T) {
	s := New(Options{Log: quietLog()})
	events, cancel := s.Subscribe()
	defer cancel()
	for _, svc := range []Service{
		{Name: "runtime", Path: "/bin/sleep", Args: []string{"60"}},
		// Slow to stop: it ignores SIGTERM, so it is killed after
		// StopTimeout.
		{Name: "agent", Path: "/bin/sh", Args: []string{"-c", `trap "" TERM; sleep 60 & wait`}, StopBefore: []string{"runtime"}, StopTimeout: 500 * time.Millisecond},
	} {
		if err := s.Add(svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both running", func() bool {
		st := s.Status()
		return len(st) == 2 && st[0].State == StateReady && st[1].State == StateReady
	})
	stop(t, s)
	var all []string
	for e := range events {
		all = append(all, e.Service+" "+string(e.State))
		if e.Service == "runtime" && e.State == StateStopped {
			break
		}
	}
	if i, j := slices.Index(all, "agent Stopped"), slices.Index(all, "runtime Stopping"); i < 0 || i > j {
		t.Errorf("agent Stopped at %d, runtime Stopping at %d, want the agent stopped first; events: %q", i, j, all)
	}
}

func TestStartRejectsBadDependencies(t *testing.T) {
	tests := []struct {
		name     string
		services []Service
		want     string
	}{
		{
			"unknown",
			[]Service{{Name: "a", Path: "/bin/true", DependsOn: []string{"x"}}},
			`service "a" depends on unknown service "x"`,
		},
		{
			"cycle",
			[]Service{
				{Name: "a", Path: "/bin/true", DependsOn: []string{"b"}},
				{Name: "b", Path: "/bin/true", DependsOn: []string{"c"}},
				{Name: "c", Path: "/bin/true", DependsOn: []string{"a"}},
			},
			"dependency cycle: a -> b -> c -> a",
		},
		{
			"self",
			[]Service{{Name: "a", Path: "/bin/true", DependsOn: []string{"a"}}},
			"dependency cycle: a -> a",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Options{Log: quietLog()})
			for _, svc := range tt.services {
				if err := s.Add(svc); err != nil {
					t.Fatal(err)
				}
			}
			err := s.Start()
			if err == nil || err.Error() != tt.want {
				t.Errorf("Start() = %v, want %q", err, tt.want)
			}
			for _, st := range s.Status() {
				if st.State != StateWaiting {
					t.Errorf("State(%s) after a failed Start = %s, want %s", st.Name, st.State, StateWaiting)
				}
			}
			stop(t, s)
		})
	}
}

func TestAddRejectsBadServices(t *testing.T) {
	tests := []struct {
		name string
		svc  Service
	}{
		{"no name", Service{Path: "/bin/true"}},
		{"duplicate", Service{Name: "a", Path: "/bin/true"}},
		{"nothing to run", Service{Name: "b"}},
		{"path and launcher", Service{Name: "b", Path: "/bin/true", Launcher: processLauncher{}}},
		{"log file without LogDir", Service{Name: "b", Path: "/bin/true", LogFile: "b.log"}},
		{"log file with a path", Service{Name: "b", Path: "/bin/true", LogFile: "../b.log"}},
		{"absolute cgroup", Service{Name: "b", Path: "/bin/true", Cgroup: "/b"}},
		{"cgroup out of the root", Service{Name: "b", Path: "/bin/true", Cgroup: "../b"}},
		{"cgroup taken", Service{Name: "b", Path: "/bin/true", Cgroup: "system/a"}},
	}
	s := New(Options{Log: quietLog()})
	if err := s.Add(Service{Name: "a", Path: "/bin/true", Cgroup: "system/a"}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		if err := s.Add(tt.svc); err == nil {
			t.Errorf("%s: Add(%+v) = nil, want an error", tt.name, tt.svc)
		}
	}
}

// TestMissingBinary: a service whose binary is missing backs off with the
// reason in its status and its log, while the others keep running.
func TestMissingBinary(t *testing.T) {
	clock := newFakeClock()
	s := New(Options{Clock: clock, Log: quietLog()})
	for _, svc := range []Service{
		{Name: "missing", Path: "/nonexistent/binary"},
		{Name: "fine", Path: "/bin/sleep", Args: []string{"60"}},
	} {
		if err := s.Add(svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	fine := waitState(t, s, "fine", StateReady)
	st := waitState(t, s, "missing", StateBackoff)
	const why = "fork/exec /nonexistent/binary: no such file or directory"
	if st.Reason != why {
		t.Errorf("Reason = %q, want %q", st.Reason, why)
	}
	logs, err := s.Logs("missing", 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[supervisor] start failed: " + why + "\n"; !strings.HasPrefix(string(logs), want) {
		t.Errorf("Logs(missing) = %q, want it to begin with %q", logs, want)
	}
	// Past the first backoff delay, fine is still the same run.
	clock.Advance(clock.waitTimer(t))
	clock.waitTimer(t)
	if st := status(t, s, "missing"); st.State != StateBackoff || st.Restarts != 1 {
		t.Errorf("missing after a second attempt: State, Restarts = %s, %d, want %s, 1", st.State, st.Restarts, StateBackoff)
	}
	if now := status(t, s, "fine"); now.State != StateReady || now.Pid != fine.Pid {
		t.Errorf("fine is %s with pid %d, want %s with pid %d", now.State, now.Pid, StateReady, fine.Pid)
	}
}

func TestRestart(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "svc.sock")
	s := New(Options{Log: quietLog()})
	if err := s.Add(listener("svc", sock, 100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	before := waitState(t, s, "svc", StateReady)
	if err := s.Restart("svc"); err != nil {
		t.Fatalf("Restart(svc) = %v, want nil", err)
	}
	if err := syscall.Kill(before.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("old run (pid %d) after Restart: kill(0) = %v, want ESRCH", before.Pid, err)
	}
	after := waitState(t, s, "svc", StateReady)
	if after.Restarts != 1 || after.Pid == before.Pid || after.LastExit != "killed by signal terminated" {
		t.Errorf("after Restart: Restarts, Pid, LastExit = %d, %d, %q; want 1, not %d, %q",
			after.Restarts, after.Pid, after.LastExit, before.Pid, "killed by signal terminated")
	}
	if err := s.Restart("nope"); err == nil {
		t.Error("Restart(nope) = nil, want an error")
	}
}

// TestRemove stops and forgets a running service, not one another
// depends on; its name can be added again.
func TestRemove(t *testing.T) {
	dir := t.TempDir()
	s := New(Options{Log: quietLog()})
	for _, svc := range []Service{
		listener("base", filepath.Join(dir, "base.sock"), 0),
		{Name: "top", Path: "/bin/sleep", Args: []string{"60"}, DependsOn: []string{"base"}},
	} {
		if err := s.Add(svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	top := waitState(t, s, "top", StateReady)
	ctx := context.Background()
	if err := s.Remove(ctx, "base"); err == nil || !strings.Contains(err.Error(), "top depend on it") {
		t.Errorf("Remove(base) = %v, want a refusal naming top", err)
	}
	if err := s.Remove(ctx, "top"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(top.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("top's process (pid %d) after Remove: kill(0) = %v, want ESRCH", top.Pid, err)
	}
	for _, st := range s.Status() {
		if st.Name == "top" {
			t.Errorf("Status() after Remove(top) still has it: %+v", st)
		}
	}
	if err := s.Remove(ctx, "top"); err == nil {
		t.Error("Remove(top) twice succeeded")
	}
	if err := s.Add(Service{Name: "top", Path: "/bin/sleep", Args: []string{"60"}, DependsOn: []string{"base"}}); err != nil {
		t.Fatalf("Add(top) again = %v", err)
	}
	if again := waitState(t, s, "top", StateReady); again.Pid == top.Pid {
		t.Errorf("top added again runs as pid %d, the removed run's", again.Pid)
	}
}

// TestEvents follows one service through its life.
func TestEvents(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	s := New(Options{Log: quietLog()})
	events, cancel := s.Subscribe()
	defer cancel()
	err := s.Add(Service{
		Name: "svc", Path: "/bin/sh", Ready: FileProbe(ready),
		Args: []string{"-c", `sleep 0.2; touch "$1"; exec sleep 60`, "sh", ready},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, "svc", StateReady)
	stop(t, s)

	var got []State
	var last time.Time
	for e := range events {
		got = append(got, e.State)
		if e.Time.Before(last) {
			t.Errorf("event %s at %s, before the one ahead of it at %s", e.State, e.Time, last)
		}
		last = e.Time
		if e.State == StateStopped {
			break
		}
	}
	want := []State{StateWaiting, StateStarting, StateRunning, StateReady, StateStopping, StateStopped}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestPolicies(t *testing.T) {
	tests := []struct {
		policy Policy
		exit   string
		want   State
	}{
		{RestartNever, "exit 1", StateFailed},
		{RestartNever, "exit 0", StateStopped},
		{RestartOnFailure, "exit 0", StateStopped},
		{RestartOnFailure, "exit 2", StateBackoff},
		{RestartOnFailure, "kill -9 $$", StateBackoff},
		{RestartAlways, "exit 0", StateBackoff},
	}
	for _, tt := range tests {
		clock := newFakeClock() // backoff never ends
		s := New(Options{Clock: clock, Log: quietLog()})
		if err := s.Add(Service{Name: "svc", Path: "/bin/sh", Args: []string{"-c", tt.exit}, Restart: tt.policy}); err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the run to end", func() bool { return status(t, s, "svc").LastExit != "" })
		if st := waitState(t, s, "svc", tt.want); st.Reason != st.LastExit {
			t.Errorf("policy %d, %q: Reason = %q, want %q", tt.policy, tt.exit, st.Reason, st.LastExit)
		}
		stop(t, s)
	}
}

// TestLauncher runs a service through a Launcher that is not a process,
// as an OCI runtime would be: policy, logs and stop work the same.
func TestLauncher(t *testing.T) {
	l := &goroutineLauncher{}
	clock := newFakeClock()
	s := New(Options{Clock: clock, Log: quietLog()})
	s.restartBackoff.Jitter = 0 // the log line says the delay
	if err := s.Add(Service{Name: "svc", Launcher: l, StopSignal: syscall.SIGINT}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(clock.waitTimer(t))
	st := waitState(t, s, "svc", StateReady)
	if st.Pid != 2 {
		t.Errorf("Pid = %d, want 2", st.Pid)
	}
	stop(t, s)
	logs, _ := s.Logs("svc", 0)
	want := "[supervisor] start failed: first launch fails\n" +
		"[supervisor] restarting in 1s\n" +
		"run 2\n" +
		"[supervisor] stopping (stop requested): sending interrupt\n" +
		"got interrupt\n"
	if diff := cmp.Diff(want, string(logs)); diff != "" {
		t.Errorf("Logs(svc) (-want +got):\n%s", diff)
	}
}

// TestPanicsFailTheService: a Launcher or a readiness probe that panics
// fails that service's start or check, as an error would — the service
// backs off and starts again — and the supervisor (PID 1 on a node) lives.
func TestPanicsFailTheService(t *testing.T) {
	l := &goroutineLauncher{panics: true}
	clock := newFakeClock()
	s := New(Options{Clock: clock, Log: quietLog()})
	checks := 0
	probe := ProbeFunc(func(context.Context) error {
		checks++
		if checks == 1 {
			var m map[string]int
			m["nil map"] = 1 // a real runtime panic
		}
		return nil
	})
	if err := s.Add(Service{Name: "svc", Launcher: l, StopSignal: syscall.SIGINT, Ready: probe}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the panic's backoff", func() bool {
		return strings.Contains(status(t, s, "svc").Reason, "launch panicked: first launch panics")
	})
	clock.Advance(clock.waitTimer(t))
	waitFor(t, "the probe's panic as its reason", func() bool {
		return strings.Contains(status(t, s, "svc").Reason, "not ready: readiness probe panicked: assignment to entry in nil map")
	})
	clock.Advance(clock.waitTimer(t))
	if st := waitState(t, s, "svc", StateReady); st.Pid != 2 || st.Restarts != 1 {
		t.Errorf("after the panics: pid %d, restarts %d; want run 2 ready after one restart", st.Pid, st.Restarts)
	}
	stop(t, s)
	logs, _ := s.Logs("svc", 0)
	if !strings.HasPrefix(string(logs), "[supervisor] start failed: launch panicked: first launch panics\n") {
		t.Errorf("Logs(svc) = %q", logs)
	}
}

// goroutineLauncher fails (or, with panics, panics in) its first launch;
// later runs are goroutines that end when signalled.
type goroutineLauncher struct {
	runs   int
	panics bool
}

func (l *goroutineLauncher) Launch(_ context.Context, opts LaunchOptions) (Instance, error) {
	l.runs++
	if l.runs == 1 && l.panics {
		panic("first launch panics")
	}
	if l.runs == 1 {
		return nil, errors.New("first launch fails")
	}
	io.WriteString(opts.Output, "run 2\n")
	g := &goroutine{pid: l.runs, out: opts.Output, sig: make(chan syscall.Signal, 1), exit: make(chan Exit, 1)}
	go func() {
		sig := <-g.sig
		io.WriteString(g.out, "got "+sig.String()+"\n")
		g.exit <- Exit{}
	}()
	return g, nil
}

type goroutine struct {
	pid  int
	out  io.Writer
	sig  chan syscall.Signal
	exit chan Exit
}

func (g *goroutine) Pid() int                        { return g.pid }
func (g *goroutine) Exited() <-chan Exit             { return g.exit }
func (g *goroutine) Signal(sig syscall.Signal) error { g.sig <- sig; return nil }
func (g *goroutine) Kill() error                     { return nil }

// TestOnReady runs a service's ready actions, in order, each time it
// becomes Ready: one that fails, one that panics and one that outlives its
// timeout are noted in the service's logs by name, and neither stops the
// ones after them nor the service.
func TestOnReady(t *testing.T) {
	s := New(Options{Log: quietLog()})
	var states []State
	ran := make(chan string, 10)
	err := s.Add(Service{
		Name: "runtime", Path: "/bin/sleep", Args: []string{"60"}, Ready: ExecProbe("/bin/true"),
		OnReady: []Action{
			{Name: "import", Run: func(context.Context) error {
				for _, st := range s.Status() {
					states = append(states, st.State)
				}
				ran <- "import"
				return nil
			}},
			{Name: "fails", Run: func(context.Context) error { return errors.New("no archive") }},
			{Name: "panics", Run: func(context.Context) error { panic("boom") }},
			{Name: "slow", Timeout: 50 * time.Millisecond, Run: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
			{Name: "last", Run: func(context.Context) error { ran <- "last"; return nil }},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	want := func(names ...string) {
		t.Helper()
		for _, name := range names {
			select {
			case got := <-ran:
				if got != name {
					t.Fatalf("action %q ran, want %q", got, name)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("action %q did not run within 10s", name)
			}
		}
	}
	want("import", "last")
	if len(states) != 1 || states[0] != StateReady {
		t.Errorf("states seen by the first action %v, want [Ready]", states)
	}
	logs, _ := s.Logs("runtime", 0)
	for _, line := range []string{
		"[supervisor] ready action fails failed: no archive\n",
		"[supervisor] ready action panics failed: panics panicked: boom\n",
		"[supervisor] ready action slow failed: context deadline exceeded\n",
	} {
		if !strings.Contains(string(logs), line) {
			t.Errorf("Logs(runtime) = %q, want it to hold %q", logs, line)
		}
	}
	if st := status(t, s, "runtime"); st.State != StateReady {
		t.Errorf("runtime is %s after its actions failed, want Ready", st.State)
	}
	// Ready again after a restart: the actions run again.
	if err := s.Restart("runtime"); err != nil {
		t.Fatal(err)
	}
	want("import", "last")
}

// TestOnReadyEndsWithTheRun: an action still running when the service's
// run ends has its context cancelled, and the next actions do not run.
func TestOnReadyEndsWithTheRun(t *testing.T) {
	s := New(Options{Log: quietLog()})
	started, ended := make(chan struct{}), make(chan error, 1)
	lastRan := make(chan struct{}, 1)
	err := s.Add(Service{
		Name: "runtime", Path: "/bin/sleep", Args: []string{"60"},
		OnReady: []Action{
			{Name: "long", Timeout: time.Hour, Run: func(ctx context.Context) error {
				close(started)
				<-ctx.Done()
				ended <- ctx.Err()
				return ctx.Err()
			}},
			{Name: "next", Run: func(context.Context) error { lastRan <- struct{}{}; return nil }},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	<-started
	stop(t, s)
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the action's context ended with %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the action's context did not end within 10s of the stop")
	}
	logs, _ := s.Logs("runtime", 0)
	if strings.Contains(string(logs), "ready action") {
		t.Errorf("Logs(runtime) = %q, want no action failure noted for a run that was stopped", logs)
	}
	select {
	case <-lastRan:
		t.Error("the next action ran after the service's run ended")
	default:
	}
}
