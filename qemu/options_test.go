package qemu

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// These tests start no QEMU.

func TestOptionsDefaults(t *testing.T) {
	t.Setenv(EnvAccel, AccelTCG)
	tests := []struct {
		name     string
		in, want Options // Notify aside
	}{
		{
			name: "unset",
			in:   Options{Disk: "/d/node.raw"},
			want: Options{Disk: "/d/node.raw", APIPort: 50000, MemoryMiB: 2048, CPUs: 2,
				ConsoleLog: "/d/node.raw.console.log", EFIVars: "/d/node.raw.efivars",
				Accel: AccelTCG, Silence: 30 * time.Second, Stall: 3 * time.Minute},
		},
		{
			name: "set",
			in: Options{Disk: "/d/node.raw", APIPort: 1, MetricsPort: 2, MemoryMiB: 3, CPUs: 4,
				ConsoleLog: "/c.log", EFIVars: "/e.vars", IsolatedNIC: true, Accel: AccelKVM, Silence: time.Second, Stall: time.Minute},
			want: Options{Disk: "/d/node.raw", APIPort: 1, MetricsPort: 2, MemoryMiB: 3, CPUs: 4,
				ConsoleLog: "/c.log", EFIVars: "/e.vars", IsolatedNIC: true, Accel: AccelKVM, Silence: time.Second, Stall: time.Minute},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in
			got.setDefaults()
			if got.Notify == nil {
				t.Error("setDefaults left Notify nil")
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreFields(Options{}, "Notify")); diff != "" {
				t.Errorf("setDefaults (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDefaultAccel(t *testing.T) {
	t.Setenv(EnvAccel, "")
	if got := DefaultAccel(); got != AccelAuto {
		t.Errorf("DefaultAccel() without %s = %q, want %q", EnvAccel, got, AccelAuto)
	}
	t.Setenv(EnvAccel, AccelKVM)
	if got := DefaultAccel(); got != AccelKVM {
		t.Errorf("DefaultAccel() with %s=kvm = %q", EnvAccel, got)
	}
}

// TestNewVMUnknownAccel: a misspelt accelerator is refused before
// anything else is looked at, naming the valid ones.
func TestNewVMUnknownAccel(t *testing.T) {
	_, err := newVM(Options{Disk: filepath.Join(t.TempDir(), "node.raw"), Accel: "fast"})
	if err == nil || err.Error() != `accelerator "fast": want auto, kvm or tcg` {
		t.Errorf("newVM with accel fast = %v, want the valid accelerators named", err)
	}
}

// TestNewVMEFIVars: the first VM of a disk gets a copy of OVMF's variable
// template; a later one keeps the store as the last run left it (the boot
// entries the firmware wrote).
func TestNewVMEFIVars(t *testing.T) {
	needQEMU(t)
	disk := emptyDisk(t)
	vm, err := newVM(Options{Disk: disk})
	if err != nil {
		t.Fatal(err)
	}
	template, err := os.ReadFile(ovmfVars)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(vm.Opts.EFIVars)
	if err != nil {
		t.Fatalf("no variable store after newVM: %v", err)
	}
	if !bytes.Equal(got, template) {
		t.Errorf("variable store %s is not a copy of %s", vm.Opts.EFIVars, ovmfVars)
	}
	if err := os.WriteFile(vm.Opts.EFIVars, []byte("written by the firmware"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := newVM(Options{Disk: disk}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(vm.Opts.EFIVars); string(got) != "written by the firmware" {
		t.Errorf("a second newVM replaced the variable store with %d bytes", len(got))
	}
}

func TestDiskFormat(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, path, want, wantErr string
	}{
		{name: "qcow2", path: write("node.qcow2", []byte("QFI\xfb\x00\x00\x00\x03")), want: "qcow2"},
		{name: "raw", path: write("node.raw", make([]byte, 512)), want: "raw"},
		{name: "too short", path: write("short", []byte("QF")), wantErr: "read " + filepath.Join(dir, "short")},
		{name: "missing", path: filepath.Join(dir, "nosuch"), wantErr: "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := diskFormat(tt.path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("diskFormat(%q) = %q, %v, want an error with %q", tt.path, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("diskFormat(%q) = %q, %v, want %q", tt.path, got, err, tt.want)
			}
		})
	}
}

func TestNetdev(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{name: "API only", o: Options{APIPort: 40000}, want: "user,id=n0,hostfwd=tcp:127.0.0.1:40000-:50000"},
		{name: "API and metrics", o: Options{APIPort: 40000, MetricsPort: 40001},
			want: "user,id=n0,hostfwd=tcp:127.0.0.1:40000-:50000,hostfwd=tcp:127.0.0.1:40001-:50001"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := netdev(tt.o); got != tt.want {
				t.Errorf("netdev(%+v) = %q, want %q", tt.o, got, tt.want)
			}
		})
	}
}

func TestFirstLine(t *testing.T) {
	for _, tt := range []struct{ s, want string }{
		{"", ""},
		{"\n  \n", ""},
		{"\n  qemu: warning: x \nsecond\n", ": qemu: warning: x"},
	} {
		if got := firstLine(": ", tt.s); got != tt.want {
			t.Errorf("firstLine(%q) = %q, want %q", tt.s, got, tt.want)
		}
	}
}

// TestProgressMark: the kernel's reports of a stuck CPU are no progress,
// however many there are; any other line is.
func TestProgressMark(t *testing.T) {
	stuck := []string{
		"cairn: boot done at=13.105s",
		"[   40.681532] watchdog: BUG: soft lockup - CPU#0 stuck for 26s! [init:92]",
		"[   40.772421] watchdog: BUG: soft lockup - CPU#1 stuck for 26s! [init:93]",
		"[   68.680408] watchdog: BUG: soft lockup - CPU#0 stuck for 52s! [init:92]",
		"[   63.011111] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
	}
	if got := progressMark(stuck); got != 1 {
		t.Errorf("progressMark(a console of stuck-CPU reports after one line) = %d, want 1", got)
	}
	if a, b := progressMark(stuck[:2]), progressMark(append(stuck, "cairn: start services")); a == b {
		t.Errorf("progressMark did not change with a line of the node's own (%d)", a)
	}
}

// TestWaitReadyEnds: WaitReady returns at once when the probe succeeds,
// and otherwise says why it gave up — the caller's deadline, QEMU's exit,
// a console that stopped changing — with what it waited for, the last
// probe's error and the console's last lines.
func TestWaitReadyEnds(t *testing.T) {
	refused := errors.New("connection refused")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		probe   error
		exited  error // QEMU has exited with this; nil: it runs
		stall   time.Duration
		stderr  string
		want    []string
		notWant []string
	}{
		{name: "ready", ctx: context.Background()},
		{
			name: "caller's deadline", ctx: cancelled, probe: refused,
			want:    []string{"node not ready after 0s waiting for the API (last probe: connection refused)", "console:\n  line 3\n  line 4\n  line 5\n  line 6\n  line 7"},
			notWant: []string{"line 2"},
		},
		{
			name: "qemu exited", ctx: context.Background(), probe: refused, exited: errors.New("qemu: exit status 1"),
			want: []string{"qemu exited before the node was ready: qemu: exit status 1", "line 7"},
		},
		{
			name: "stall", ctx: context.Background(), probe: refused, stall: time.Nanosecond, stderr: "qemu-system-x86_64: warning: x\n",
			want: []string{"node makes no progress: its console has not changed for 1ns while waiting for the API (last probe: connection refused)",
				"\nqemu said: qemu-system-x86_64: warning: x", "line 7"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "console.log")
			if err := os.WriteFile(log, []byte("line 1\nline 2\nline 3\nline 4\nline 5\nline 6\nline 7\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			stall := tt.stall
			if stall == 0 {
				stall = time.Hour
			}
			vm := &VM{Opts: Options{ConsoleLog: log, Stall: stall}, accel: AccelTCG, stderr: &watchedBuffer{}, done: make(chan struct{})}
			vm.stderr.Write([]byte(tt.stderr))
			if tt.exited != nil {
				vm.err = tt.exited
				close(vm.done)
			}
			probes := 0
			var lines []string
			err := vm.WaitReady(tt.ctx, "the API",
				func(context.Context) error { probes++; return tt.probe },
				func(_ time.Duration, line string) { lines = append(lines, line) })
			if probes != 1 {
				t.Errorf("WaitReady probed %d times, want once", probes)
			}
			if tt.want == nil {
				if err != nil || lines != nil {
					t.Errorf("WaitReady with a ready node = %v after progress %q, want nil at once", err, lines)
				}
				return
			}
			if err == nil {
				t.Fatal("WaitReady = nil for a node that is not ready")
			}
			for _, w := range append(tt.want, "; see "+log) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("WaitReady error lacks %q:\n%v", w, err)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(err.Error(), w) {
					t.Errorf("WaitReady error has %q:\n%v", w, err)
				}
			}
			if want := []string{"waiting for the API (tcg): line 7"}; !cmp.Equal(lines, want) {
				t.Errorf("progress lines = %q, want %q", lines, want)
			}
		})
	}
}
