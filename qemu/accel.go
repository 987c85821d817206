package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Accelerators. Auto probes KVM by running guest code and uses it only if
// that code runs; otherwise, and whenever a KVM guest fails to start, TCG.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// EnvAccel overrides the default accelerator (auto) for every VM this
// package starts without an explicit one: the tests use it.
const EnvAccel = "CAIRN_QEMU_ACCEL"

// DefaultAccel is $CAIRN_QEMU_ACCEL, or auto.
func DefaultAccel() string {
	if a := os.Getenv(EnvAccel); a != "" {
		return a
	}
	return AccelAuto
}

func checkAccel(a string) error {
	switch a {
	case AccelAuto, AccelKVM, AccelTCG:
		return nil
	}
	return fmt.Errorf("accelerator %q: want auto, kvm or tcg", a)
}

// probeExitValue is what the probe's guest code writes to isa-debug-exit;
// QEMU then exits with (value << 1) | 1.
const probeExitValue = 0x31

const probeExitCode = probeExitValue<<1 | 1

// probeTimeout bounds a probe: the guest runs five instructions.
const probeTimeout = 10 * time.Second

// probeFirmware is a 64 KiB BIOS image whose reset vector (its last 16
// bytes, at F000:FFF0) writes probeExitValue to the isa-debug-exit port
// and halts. A VM that starts but cannot run guest code never exits.
func probeFirmware(exitValue byte) []byte {
	fw := bytes.Repeat([]byte{0xf4}, 64<<10) // hlt everywhere else
	code := []byte{
		0xb0, exitValue, // mov al, exitValue
		0xe6, 0xf4, // out 0xf4, al  (isa-debug-exit)
		0xf4,       // hlt
		0xeb, 0xfd, // jmp back to hlt
	}
	copy(fw[len(fw)-16:], code)
	return fw
}

// ProbeKVM reports whether KVM can run guest code here, and if not, why.
// Opening /dev/kvm and creating a VM are not enough: on some nested hosts
// (a paravirtual KVM) the first guest instruction fails with a KVM internal
// error and QEMU stays paused for ever; on others a few real-mode
// instructions run, but OVMF's (or a kernel's) fail a little later. So
// the probe runs a few instructions, then OVMF itself until it writes to
// its console. The answer is the same for the life of the process: it is
// found once.
func ProbeKVM(ctx context.Context, qemu string) (bool, string) {
	kvmProbe.once.Do(func() { kvmProbe.ok, kvmProbe.why = probeKVM(ctx, qemu) })
	return kvmProbe.ok, kvmProbe.why
}

var kvmProbe struct {
	once sync.Once
	ok   bool
	why  string
}

func probeKVM(ctx context.Context, qemu string) (bool, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("/dev/kvm: %v", err)
	}
	f.Close()
	if err := runProbe(ctx, qemu, AccelKVM, probeFirmware(probeExitValue), probeTimeout); err != nil {
		return false, err.Error()
	}
	if err := probeOVMF(ctx, qemu); err != nil {
		return false, err.Error()
	}
	return true, ""
}

// ovmfProbeTimeout bounds the wait for OVMF's first console output under
// KVM, which takes a second or two where KVM works.
const ovmfProbeTimeout = 10 * time.Second

// probeOVMF boots OVMF, with no disk, under KVM and waits for it to write
// to its serial console.
func probeOVMF(ctx context.Context, qemu string) error {
	dir, err := os.MkdirTemp("", "cairn-qemu-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	vars, console := filepath.Join(dir, "vars.fd"), filepath.Join(dir, "console")
	if err := copyFile(ovmfVars, vars); err != nil {
		return fmt.Errorf("%s: %w: install the Debian package ovmf", ovmfVars, err)
	}
	ctx, cancel := context.WithTimeout(ctx, ovmfProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, append(accelArgs(AccelKVM),
		"-machine", "q35", "-m", "256", "-nodefaults", "-display", "none", "-no-reboot",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmfCode,
		"-drive", "if=pflash,format=raw,unit=1,file="+vars,
		"-serial", "file:"+console)...)
	stderr := &watchedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if st, err := os.Stat(console); err == nil && st.Size() > 0 {
				cancel()
				<-exited
				return nil
			}
			if why := kvmFailure(stderr.String()); why != "" {
				cancel()
				<-exited
				return errors.New("OVMF under KVM failed: " + why)
			}
		case err := <-exited:
			if ctx.Err() != nil {
				return fmt.Errorf("OVMF under KVM wrote nothing to its console in %s%s", ovmfProbeTimeout, firstLine(": ", kvmFailure(stderr.String())))
			}
			return fmt.Errorf("OVMF under KVM ended before it wrote to its console: %v%s", err, firstLine(": ", stderr.String()))
		}
	}
}

// runProbe boots firmware with accel and checks that it exits through
// isa-debug-exit with probeExitCode.
func runProbe(ctx context.Context, qemu, accel string, firmware []byte, timeout time.Duration) error {
	dir, err := os.MkdirTemp("", "cairn-qemu-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bios := filepath.Join(dir, "probe.bin")
	if err := os.WriteFile(bios, firmware, 0o644); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, append(accelArgs(accel),
		"-machine", "q35", "-m", "16", "-nodefaults", "-display", "none", "-no-reboot",
		"-bios", bios, "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && exit.ExitCode() == probeExitCode:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("a %s guest did not run its first instructions in %s%s", accel, timeout, firstLine(": ", stderr.String()))
	case err == nil:
		return fmt.Errorf("a %s guest exited without running its code", accel)
	default:
		return fmt.Errorf("a %s guest failed: %v%s", accel, err, firstLine(": ", stderr.String()))
	}
}

// accelArgs are QEMU's arguments for an accelerator.
func accelArgs(accel string) []string {
	if accel == AccelKVM {
		return []string{"-accel", "kvm", "-cpu", "host"}
	}
	return []string{"-accel", "tcg", "-cpu", "max"}
}

// kvmFailure returns the line of QEMU's stderr that says KVM failed to run
// the guest, if there is one.
func kvmFailure(stderr string) string {
	for _, line := range strings.Split(stderr, "\n") {
		l := strings.ToLower(line)
		if strings.Contains(l, "kvm internal error") || strings.Contains(l, "kvm run failed") ||
			strings.Contains(l, "kvm_run") || strings.Contains(l, "failed to initialize kvm") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// firstLine returns prefix and the first non-empty line of s, or "".
func firstLine(prefix, s string) string {
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			return prefix + line
		}
	}
	return ""
}
