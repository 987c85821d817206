package stage2

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/supervisor"
	"github.com/cairn-os/cairn/test/need"
	"github.com/google/go-cmp/cmp"
)

// fakeSystem records what shutdown does to the machine instead of doing it.
// Its reboot reports the command and ends the shutdown goroutine, as the
// real one ends the machine.
type fakeSystem struct {
	mu       sync.Mutex
	signals  []unix.Signal
	unmounts []string
	rebooted chan int
}

func newFakeSystem() *fakeSystem { return &fakeSystem{rebooted: make(chan int, 1)} }

func (f *fakeSystem) system() system {
	return system{
		killAll: func(sig unix.Signal) { f.mu.Lock(); f.signals = append(f.signals, sig); f.mu.Unlock() },
		childless: func() <-chan struct{} {
			gone := make(chan struct{})
			close(gone)
			return gone
		},
		unmount: func(path string, _ int) error {
			f.mu.Lock()
			f.unmounts = append(f.unmounts, path)
			f.mu.Unlock()
			return unix.EINVAL
		},
		sync: func() {},
		reboot: func(cmd int) error {
			f.rebooted <- cmd
			runtime.Goexit()
			return nil
		},
	}
}

// wantReboot waits for the fake reboot and checks its command.
func (f *fakeSystem) wantReboot(t *testing.T, want int, within time.Duration) {
	t.Helper()
	select {
	case got := <-f.rebooted:
		if got != want {
			t.Errorf("reboot(%#x), want reboot(%#x)", got, want)
		}
	case <-time.After(within):
		t.Fatalf("no reboot(%#x) within %s", want, within)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.signals) != 2 || f.signals[0] != unix.SIGTERM || f.signals[1] != unix.SIGKILL {
		t.Errorf("processes signalled %v, want SIGTERM then SIGKILL", f.signals)
	}
}

// TestShutdownWithoutSupervisor is a node whose boot never made the
// supervisor (no machine config): shutdown used to call Stop on nil and
// kill PID 1; it must power off.
func TestShutdownWithoutSupervisor(t *testing.T) {
	for _, cmd := range []int{unix.LINUX_REBOOT_CMD_POWER_OFF, unix.LINUX_REBOOT_CMD_RESTART} {
		fs := newFakeSystem()
		n := newNode(fs.system(), nil)
		n.loadErr = errors.New("unknown field")
		n.requestShutdown(cmd, "test")
		fs.wantReboot(t, cmd, 10*time.Second)
	}
}

// TestShutdownStopsServices stops a real supervised process before the
// rest of the machine goes down, and unmounts the disks in reverse order.
func TestShutdownStopsServices(t *testing.T) {
	sleep := need.Tool(t, "sleep", "coreutils")
	sup := supervisor.New(supervisor.Options{LogDir: t.TempDir()})
	if err := sup.Add(supervisor.Service{Name: "sleeper", Path: sleep, Args: []string{"1000"}}); err != nil {
		t.Fatal(err)
	}
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	waitState(t, sup, "sleeper", supervisor.StateReady) // no probe: ready once started
	fs := newFakeSystem()
	n := newNode(fs.system(), nil)
	n.services, n.disks = sup, []string{"/nonexistent/var", "/nonexistent/state"}
	n.shutdownMarker = filepath.Join(t.TempDir(), "shutting-down")
	n.requestShutdown(unix.LINUX_REBOOT_CMD_POWER_OFF, "test")
	fs.wantReboot(t, unix.LINUX_REBOOT_CMD_POWER_OFF, 30*time.Second)
	// The agent, stopped next, finds it and ends the pods first.
	if b, err := os.ReadFile(n.shutdownMarker); err != nil || string(b) != "power off\n" {
		t.Errorf("shutdown marker %q (%v), want %q", b, err, "power off\n")
	}
	// The shutdown is in the timeline, step by step, up to the power off
	// (which does not return to be recorded).
	var steps []string
	for _, r := range n.timeline.Records() {
		steps = append(steps, r.Name)
		if r.Err != "" {
			t.Errorf("shutdown step %q failed: %s", r.Name, r.Err)
		}
	}
	if diff := cmp.Diff([]string{"stop the boot", "tell the agent", "stop services", "end processes", "sync", "unmount disks"}, steps); diff != "" {
		t.Errorf("timeline (-want +got):\n%s", diff)
	}
	if s := state(sup, "sleeper"); s != supervisor.StateStopped {
		t.Errorf("sleeper is %s after shutdown, want %s", s, supervisor.StateStopped)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if got := strings.Join(fs.unmounts, " "); got != "/nonexistent/state /nonexistent/var" {
		t.Errorf("unmounted %q, want STATE then /var", got)
	}
}

// TestShutdownSurvivesPanic: a panic on the way down (here in ending the
// processes) does not stop the power off.
func TestShutdownSurvivesPanic(t *testing.T) {
	fs := newFakeSystem()
	sys := fs.system()
	sys.killAll = func(unix.Signal) { panic("boom") }
	n := newNode(sys, nil)
	n.requestShutdown(unix.LINUX_REBOOT_CMD_POWER_OFF, "test")
	select {
	case got := <-fs.rebooted:
		if got != unix.LINUX_REBOOT_CMD_POWER_OFF {
			t.Errorf("reboot(%#x), want power off", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no power off after a panic during shutdown")
	}
}

// TestShutdownDuringBoot: a shutdown asked for while a boot step runs
// waits for that step, and no later step starts.
func TestShutdownDuringBoot(t *testing.T) {
	fs := newFakeSystem()
	n := newNode(fs.system(), nil)
	inStep, release := make(chan struct{}), make(chan struct{})
	laterRan := false
	booted := n.startBoot(boot.Sequence{Name: "boot", Steps: []boot.Step{
		{Name: "slow", Run: func() error { close(inStep); <-release; return nil }},
		{Name: "later", Run: func() error { laterRan = true; return nil }},
	}})
	<-inStep
	n.requestShutdown(unix.LINUX_REBOOT_CMD_POWER_OFF, "test")
	<-n.stop // the shutdown has begun
	close(release)
	fs.wantReboot(t, unix.LINUX_REBOOT_CMD_POWER_OFF, 10*time.Second)
	if err := <-booted; err != nil {
		t.Errorf("boot = %v, want nil (stopped by the shutdown)", err)
	}
	if laterRan {
		t.Error("a boot step ran after the shutdown began")
	}
	recs := map[string]boot.Record{}
	for _, r := range n.timeline.Records() {
		recs[r.Name] = r
	}
	slow, stop := recs["slow"], recs["stop the boot"]
	if end := func(r boot.Record) time.Duration { return r.Start + r.Duration }; stop.Name == "" || end(stop) < end(slow) {
		t.Errorf("shutdown's stop the boot %+v, want it to end after the running boot step %+v", stop, slow)
	}
}

// TestShutdownBootStuck: a boot step that does not end in time is left
// behind; the shutdown goes on without the services, and unmounts the
// disks by name.
func TestShutdownBootStuck(t *testing.T) {
	n := newNode(newFakeSystem().system(), nil)
	stuck := make(chan struct{})
	defer close(stuck)
	inStep := make(chan struct{})
	n.startBoot(boot.Sequence{Name: "boot", Steps: []boot.Step{
		{Name: "stuck", Run: func() error { close(inStep); <-stuck; return nil }},
	}})
	<-inStep
	sup, disks, err := n.stopBoot(100 * time.Millisecond)
	if sup != nil || err == nil || !strings.Contains(err.Error(), "still running after 100ms") {
		t.Errorf("stopBoot() = %v, %v; want no supervisor and the step still running", sup, err)
	}
	if diff := cmp.Diff([]string{varDir, layout.StateDir}, disks); diff != "" {
		t.Errorf("disks to unmount (-want +got):\n%s", diff)
	}
}

// TestBootStepPanic: a step that panics fails, and the boot goes on.
func TestBootStepPanic(t *testing.T) {
	n := newNode(newFakeSystem().system(), nil)
	var nilSupervisor *supervisor.Supervisor
	ran := false
	err := <-n.startBoot(boot.Sequence{Name: "boot", Steps: []boot.Step{
		{Name: "panics", Run: func() error { nilSupervisor.Status(); return nil }},
		{Name: "after", Run: func() error { ran = true; return nil }},
	}})
	if err != nil || !ran {
		t.Errorf("boot = %v, later step ran %v; want nil and the boot gone on", err, ran)
	}
	if recs := n.timeline.Records(); len(recs) != 2 || !strings.HasPrefix(recs[0].Err, "panic: ") {
		t.Errorf("timeline %+v, want the panicking step recorded with its panic", recs)
	}
}

// TestBootTimelineDuringStep: the control socket answers BootTimeline
// while a boot step waits (a DHCP exchange, say).
func TestBootTimelineDuringStep(t *testing.T) {
	n := newNode(newFakeSystem().system(), []boot.Record{{Name: "mount root squashfs", Start: time.Second}})
	c := controlClient(t, n)
	release := make(chan struct{})
	defer close(release)
	inStep := make(chan struct{})
	n.startBoot(boot.Sequence{Name: "boot", Steps: []boot.Step{
		{Name: "mount system filesystems", Run: func() error { return nil }},
		{Name: "configure network", Run: func() error { close(inStep); <-release; return nil }},
	}})
	<-inStep
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tl, err := c.BootTimeline(ctx, &machine.BootTimelineRequest{})
	if err != nil {
		t.Fatalf("BootTimeline() during a boot step = %v", err)
	}
	var names []string
	for _, s := range tl.Steps {
		names = append(names, s.Name)
	}
	if diff := cmp.Diff([]string{"mount root squashfs", "mount system filesystems"}, names); diff != "" {
		t.Errorf("BootTimeline() during a step (-want +got):\n%s", diff)
	}
	if _, err := c.Services(ctx, &machine.ServicesRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Services() during the boot = %v, want Unavailable", err)
	}
}

// TestControlWithoutSupervisor serves the control socket of a node whose
// config did not load: calls that need the supervisor say why there is
// none, the boot timeline answers, and Shutdown powers off.
func TestControlWithoutSupervisor(t *testing.T) {
	fs := newFakeSystem()
	loadErr := errors.New(`/system/state/config.yaml: unknown field "futureField"`)
	n := newNode(fs.system(), []boot.Record{{Name: "load machine config", Start: time.Second, Err: loadErr.Error()}})
	n.loadErr = loadErr
	c := controlClient(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	tl, err := c.BootTimeline(ctx, &machine.BootTimelineRequest{})
	if err != nil || len(tl.Steps) != 1 || tl.Steps[0].Error != loadErr.Error() {
		t.Errorf("BootTimeline() = %v, %v; want the load error in its one step", tl, err)
	}
	_, err = c.Services(ctx, &machine.ServicesRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "futureField") {
		t.Errorf("Services() error = %v, want Unavailable naming the load error", err)
	}
	_, err = c.ServiceRestart(ctx, &machine.ServiceRestartRequest{Name: "containerd"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ServiceRestart() error = %v, want Unavailable", err)
	}
	logs, err := c.Logs(ctx, &machine.LogsRequest{Service: "cairn-agent"})
	if err == nil {
		_, err = logs.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Logs() error = %v, want Unavailable", err)
	}
	if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); err != nil {
		t.Fatalf("Shutdown() = %v", err)
	}
	fs.wantReboot(t, unix.LINUX_REBOOT_CMD_POWER_OFF, 10*time.Second)
}

// TestControlReboot: Reboot on the control socket reboots.
func TestControlReboot(t *testing.T) {
	fs := newFakeSystem()
	n := newNode(fs.system(), nil)
	c := controlClient(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Reboot(ctx, &machine.RebootRequest{}); err != nil {
		t.Fatalf("Reboot() = %v", err)
	}
	fs.wantReboot(t, unix.LINUX_REBOOT_CMD_RESTART, 10*time.Second)
}

func state(sup *supervisor.Supervisor, name string) supervisor.State {
	for _, s := range sup.Status() {
		if s.Name == name {
			return s.State
		}
	}
	return ""
}

func waitState(t *testing.T, sup *supervisor.Supervisor, name string, want supervisor.State) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); state(sup, name) != want; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s is %s after 10s, want %s", name, state(sup, name), want)
		}
	}
}

// controlClient serves n's control socket in the test's directory and
// returns a client of it; both end with the test.
func controlClient(t *testing.T, n *node) machine.InitClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "init.sock")
	srv, err := n.listenControl(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return machine.NewInitClient(conn)
}

// TestEndProcesses ends the processes of a PID namespace of the test's,
// as PID 1 with the real reaper: processes that die of SIGTERM, an orphan
// among them, end the wait at once; one that ignores SIGTERM is killed
// after endWait.
func TestEndProcesses(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWPID) {
		return
	}
	r := supervisor.NewReaper()
	n := newNode(realSystem(r), nil)
	for _, script := range []string{"exec sleep 60", "sleep 60 & exit 0", "exec sleep 60"} {
		if _, err := r.Start(exec.Command("/bin/sh", "-c", script)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	n.endProcesses()
	if took := time.Since(start); took >= endWait {
		t.Errorf("endProcesses() took %s with processes that end on SIGTERM, want less than endWait (%s)", took, endWait)
	}
	waitChildless(t, r)

	// It says when it ignores SIGTERM, before it is sent.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stubborn := exec.Command("/bin/sh", "-c", "trap '' TERM; echo ignoring; exec sleep 60")
	stubborn.Stdout = pw
	if _, err := r.Start(stubborn); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if line, err := bufio.NewReader(pr).ReadString('\n'); line != "ignoring\n" {
		t.Fatalf("read from the process ignoring SIGTERM: %q, %v", line, err)
	}
	start = time.Now()
	n.endProcesses()
	if took := time.Since(start); took < endWait {
		t.Errorf("endProcesses() took %s with a process ignoring SIGTERM, want endWait (%s) before SIGKILL", took, endWait)
	}
	waitChildless(t, r)
}

func waitChildless(t *testing.T, r *supervisor.Reaper) {
	t.Helper()
	select {
	case <-r.Childless():
	case <-time.After(10 * time.Second):
		t.Fatal("processes left 10s after endProcesses")
	}
}

// TestShutdownSignals sends this process each of the signals PID 1 shuts
// down on, heard as stage 2 hears them: SIGTERM and SIGPWR (a power
// button, a UPS daemon) power the node off, Ctrl-Alt-Del's SIGINT
// restarts it.
func TestShutdownSignals(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, shutdownSignals...)
	defer signal.Stop(sigs)
	for sig, want := range map[unix.Signal]int{
		unix.SIGTERM: unix.LINUX_REBOOT_CMD_POWER_OFF,
		unix.SIGPWR:  unix.LINUX_REBOOT_CMD_POWER_OFF,
		unix.SIGINT:  unix.LINUX_REBOOT_CMD_RESTART,
	} {
		if err := unix.Kill(os.Getpid(), sig); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-sigs:
			if got != sig || shutdownFor(got) != want {
				t.Errorf("%v: heard %v, reboot command %#x; want %#x", sig, got, shutdownFor(got), want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%v not heard", sig)
		}
	}
}
