package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/poll"
)

func needQEMU(t *testing.T) string {
	t.Helper()
	path := need.Tool(t, "qemu-system-x86_64", "qemu-system-x86")
	need.File(t, ovmfCode, "ovmf")
	return path
}

// emptyDisk is a blank raw disk: OVMF finds nothing to boot on it and
// says so on the console at once.
func emptyDisk(t *testing.T) string {
	t.Helper()
	disk := filepath.Join(t.TempDir(), "empty.raw")
	f, err := os.Create(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(16 << 20); err != nil {
		t.Fatal(err)
	}
	return disk
}

// TestProbeRunsGuestCode: the probe's firmware runs under TCG and exits
// through isa-debug-exit with the value it wrote; firmware that writes
// another value, or never writes, is not taken for a running guest.
func TestProbeRunsGuestCode(t *testing.T) {
	qemu := needQEMU(t)
	ctx := context.Background()
	if err := runProbe(ctx, qemu, AccelTCG, probeFirmware(probeExitValue), probeTimeout); err != nil {
		t.Fatalf("probe under TCG: %v", err)
	}
	if err := runProbe(ctx, qemu, AccelTCG, probeFirmware(0x20), probeTimeout); err == nil {
		t.Error("probe that wrote another exit value succeeded")
	}
	hang := probeFirmware(probeExitValue)
	copy(hang[len(hang)-16:], []byte{0xf4, 0xeb, 0xfd}) // hlt; jmp: never exits
	err := runProbe(ctx, qemu, AccelTCG, hang, 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "did not run its first instructions") {
		t.Errorf("probe of a guest that never exits = %v, want a timeout", err)
	}
}

// TestProbeKVMDecision: the probe's decision on this host is what a real
// guest does under KVM. With KVM accepted, OVMF must write to its console;
// with it refused (here: /dev/kvm opens, but its vCPUs cannot run guest
// code), OVMF under KVM must not get that far — the check the probe
// replaced, a paused VM that starts, said yes on such hosts.
func TestProbeKVMDecision(t *testing.T) {
	qemu := needQEMU(t)
	ok, why := ProbeKVM(context.Background(), qemu)
	t.Logf("KVM usable: %v %s", ok, why)
	if !ok && why == "" {
		t.Fatal("KVM refused without a reason")
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		if ok {
			t.Fatal("KVM accepted without /dev/kvm")
		}
		return
	}
	// The real guest, watched for 20 s.
	vm, err := newVM(Options{Disk: emptyDisk(t), MemoryMiB: 256, CPUs: 1, Silence: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var notes []string
	vm.Opts.Notify = func(s string) { notes = append(notes, s) }
	if err := vm.start([]attempt{{accel: AccelKVM, watch: true}}); err != nil {
		t.Fatal(err)
	}
	err = vm.Wait()
	ran := len(vm.consoleLines()) > 0
	if !ran {
		// The watch stopped it.
		if err == nil || !strings.Contains(err.Error(), "KVM cannot run this guest") {
			t.Errorf("KVM guest that did not run ended with %v, want the watch's reason", err)
		}
	} else {
		vm.Kill()
	}
	if ran != ok {
		t.Errorf("probe says KVM usable=%v, but OVMF under KVM wrote to its console=%v (qemu: %v)", ok, ran, err)
	}
}

// TestFallbackToTCG: a VM whose first accelerator cannot run the guest —
// here a VM that never starts its vCPUs (-S), silent like a KVM that hit
// an internal error — is stopped and started again with TCG, and the
// caller is told why in one line; the firmware then writes to the console.
func TestFallbackToTCG(t *testing.T) {
	needQEMU(t)
	vm, err := newVM(Options{Disk: emptyDisk(t), MemoryMiB: 256, CPUs: 1, Silence: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	notes := make(chan string, 2)
	vm.Opts.Notify = func(s string) { notes <- s }
	if err := vm.start([]attempt{{accel: AccelTCG, watch: true, extra: []string{"-S"}}, {accel: AccelTCG}}); err != nil {
		t.Fatal(err)
	}
	defer vm.Kill()
	select {
	case note := <-notes:
		if !strings.Contains(note, "KVM cannot run this guest here (its console stayed silent for 2s") || !strings.HasSuffix(note, "; using TCG") {
			t.Errorf("notice = %q", note)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no fallback notice after 30s")
	}
	if got := vm.Accel(); got != AccelTCG {
		t.Errorf("Accel() = %q after the fallback", got)
	}
	if vm.Fallback() == "" {
		t.Error("Fallback() empty after the fallback")
	}
	poll.Until(t, 60*time.Second, "firmware output after the fallback", func() error {
		if !strings.Contains(strings.Join(vm.consoleLines(), "\n"), "BdsDxe") {
			return fmt.Errorf("console: %q", vm.consoleLines())
		}
		return nil
	})
}

// TestKVMFailureLines: the lines QEMU writes when KVM cannot run a guest
// are recognised, and ordinary warnings are not.
func TestKVMFailureLines(t *testing.T) {
	for _, tt := range []struct {
		stderr string
		want   bool
	}{
		{"KVM internal error. Suberror: 1\nextra data[0]: 0x0\nEAX=00000000 EBX=00000000", true},
		{"error: kvm run failed Bad address\n", true},
		{"qemu-system-x86_64: warning: host doesn't support requested feature: CPUID.80000001H:ECX.svm [bit 2]", false},
		{"", false},
	} {
		if got := kvmFailure(tt.stderr) != ""; got != tt.want {
			t.Errorf("kvmFailure(%q) = %v, want %v", tt.stderr, got, tt.want)
		}
	}
}

// TestWaitReadyStall: a boot whose console never changes fails with the
// reason once Options.Stall has passed, not when the caller's deadline does.
func TestWaitReadyStall(t *testing.T) {
	needQEMU(t)
	vm, err := newVM(Options{Disk: emptyDisk(t), MemoryMiB: 256, CPUs: 1, Stall: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.start([]attempt{{accel: AccelTCG, extra: []string{"-S"}}}); err != nil {
		t.Fatal(err)
	}
	defer vm.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var lines []string
	err = vm.WaitReady(ctx, "the API", func(context.Context) error { return fmt.Errorf("connection refused") },
		func(_ time.Duration, line string) { lines = append(lines, line) })
	if err == nil || !strings.Contains(err.Error(), "makes no progress") || !strings.Contains(err.Error(), "the console is empty") {
		t.Fatalf("WaitReady = %v, want a no-progress error naming the empty console", err)
	}
	// QEMU was started with its CPUs stopped (-S): the error says so, and
	// where they stand, at the reset vector.
	if !strings.Contains(err.Error(), "qemu status: prelaunch") || !strings.Contains(err.Error(), "vCPUs: CPU#0 EIP=0000fff0 HLT=0;") {
		t.Errorf("WaitReady = %v, want QEMU's status and its vCPUs' registers", err)
	}
	if ctx.Err() != nil {
		t.Error("WaitReady waited for the caller's deadline")
	}
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "waiting for the API (tcg)") {
		t.Errorf("progress lines = %q, want them to say what they wait for", lines)
	}
}

// TestPowerdown: Powerdown presses the ACPI power button through QEMU's
// monitor: QEMU reports the POWERDOWN event to the monitor's listeners.
// (What a node does then is asserted in the e2e.)
func TestPowerdown(t *testing.T) {
	needQEMU(t)
	vm, err := newVM(Options{Disk: emptyDisk(t), MemoryMiB: 256, CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	// A monitor of the test's own: QEMU serves one client per monitor.
	listen := filepath.Join(t.TempDir(), "events.qmp")
	if err := vm.start([]attempt{{accel: AccelTCG, extra: []string{"-S", "-qmp", "unix:" + listen + ",server=on,wait=off"}}}); err != nil {
		t.Fatal(err)
	}
	defer vm.Kill()
	var mon *qmp.SocketMonitor
	poll.Until(t, 10*time.Second, "QEMU's monitor", func() error {
		m, err := qmp.NewSocketMonitor("unix", listen, time.Second)
		if err == nil {
			err = m.Connect()
		}
		mon = m
		return err
	})
	defer mon.Disconnect()
	events, err := mon.Events(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.Powerdown(); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.Event == "POWERDOWN" {
				return
			}
		case <-timeout:
			t.Fatal("no POWERDOWN event 10s after Powerdown")
		}
	}
}

// TestQEMUDiesWithItsParent: QEMU started by a process that is then
// killed (SIGKILL: no cleanup runs) goes too.
func TestQEMUDiesWithItsParent(t *testing.T) {
	if os.Getenv("CAIRN_QEMU_PARENT") != "" {
		vm, err := newVM(Options{Disk: os.Getenv("CAIRN_QEMU_PARENT"), MemoryMiB: 128, CPUs: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := vm.start([]attempt{{accel: AccelTCG, extra: []string{"-S"}}}); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("qemu-pid %d\n", vm.cmd.Process.Pid)
		time.Sleep(time.Hour)
	}
	needQEMU(t)
	parent := exec.Command(os.Args[0], "-test.run=^TestQEMUDiesWithItsParent$")
	parent.Env = append(os.Environ(), "CAIRN_QEMU_PARENT="+emptyDisk(t))
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer parent.Process.Kill()
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	f := strings.Fields(string(buf[:n]))
	if len(f) != 2 || f[0] != "qemu-pid" {
		t.Fatalf("parent said %q", buf[:n])
	}
	pid, _ := strconv.Atoi(f[1])
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("QEMU %d not running: %v", pid, err)
	}
	parent.Process.Kill()
	parent.Wait()
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	poll.Until(t, 10*time.Second, "QEMU gone with its parent", func() error {
		if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(raw), ") Z ") {
			return fmt.Errorf("QEMU %d still runs after its parent was killed", pid)
		}
		return nil
	})
}

// TestConsoleLines: the console's lines come without the firmware's
// terminal escapes, and lines that held only escapes are dropped.
func TestConsoleLines(t *testing.T) {
	log := filepath.Join(t.TempDir(), "console.log")
	raw := "\x1b[2J\x1b[01;01H\x1b[=3h\x1b[2J\x1b[01;01H\nBdsDxe: starting Boot0001\r\n\x1b[1m\x1b[33mcairn: boot done\x1b[0m\n\n"
	if err := os.WriteFile(log, []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	vm := &VM{Opts: Options{ConsoleLog: log}}
	if got, want := vm.consoleLines(), []string{"BdsDxe: starting Boot0001", "cairn: boot done"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("consoleLines() = %q, want %q", got, want)
	}
	if got := vm.LastConsoleLine(); got != "cairn: boot done" {
		t.Errorf("LastConsoleLine() = %q", got)
	}
}
