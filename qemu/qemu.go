// Package qemu boots Cairn disk images in QEMU: UEFI firmware (OVMF), a
// virtio disk and NIC, user networking with ports forwarded to loopback, and
// the serial console written to a log file. KVM is used when the host has
// a working one; otherwise QEMU falls back to software emulation (TCG).
package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cairn-os/cairn/machineconfig"
)

// Firmware paths of Debian's ovmf package: read-only code and a template
// for the writable variable store.
const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// Options describe one VM.
type Options struct {
	Disk    string // raw or qcow2 image; booted in place
	APIPort int    // host port on 127.0.0.1 forwarded to the node's API (50000)
	// MetricsPort, if not 0, is the host port on 127.0.0.1 forwarded to
	// the node's metrics (50001).
	MetricsPort int
	MemoryMiB   int    // default 2048
	CPUs        int    // default 2
	ConsoleLog  string // default Disk + ".console.log"
	EFIVars     string // writable OVMF variable store, default Disk + ".efivars"; kept across runs
}

// VM is a running QEMU process.
type VM struct {
	Opts   Options
	Accel  string // "kvm" or "tcg"
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	stderr bytes.Buffer
}

// KVMUsable reports whether QEMU can run a VM with KVM here: /dev/kvm must
// open, and QEMU must start a paused VM with it (on some nested hosts KVM
// opens but fails on the first vCPU setup).
func KVMUsable(qemu string) bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	probe := exec.Command(qemu, "-accel", "kvm", "-machine", "q35", "-cpu", "host", "-m", "64",
		"-nodefaults", "-display", "none", "-S", "-monitor", "stdio")
	probe.Stdin = strings.NewReader("quit\n")
	return probe.Run() == nil
}

func (o *Options) setDefaults() {
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 2048
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.ConsoleLog == "" {
		o.ConsoleLog = o.Disk + ".console.log"
	}
	if o.EFIVars == "" {
		o.EFIVars = o.Disk + ".efivars"
	}
	if o.APIPort == 0 {
		o.APIPort = 50000
	}
}

// Start boots the VM and returns once QEMU runs.
func Start(o Options) (*VM, error) {
	o.setDefaults()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, errors.New("qemu-system-x86_64 not found: install the Debian package qemu-system-x86")
	}
	for _, f := range []string{ovmfCode, ovmfVars} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%s missing: install the Debian package ovmf", f)
		}
	}
	if _, err := os.Stat(o.EFIVars); errors.Is(err, os.ErrNotExist) {
		if err := copyFile(ovmfVars, o.EFIVars); err != nil {
			return nil, err
		}
	}
	format, err := diskFormat(o.Disk)
	if err != nil {
		return nil, err
	}
	os.Remove(o.ConsoleLog)
	vm := &VM{Opts: o, Accel: "tcg", done: make(chan struct{})}
	accel := []string{"-accel", "tcg", "-cpu", "max"}
	if KVMUsable(qemu) {
		vm.Accel = "kvm"
		accel = []string{"-accel", "kvm", "-cpu", "host"}
	}
	args := append(accel,
		"-machine", "q35",
		"-smp", strconv.Itoa(o.CPUs),
		"-m", strconv.Itoa(o.MemoryMiB),
		"-nodefaults", "-display", "none", "-vga", "none",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmfCode,
		"-drive", "if=pflash,format=raw,unit=1,file="+o.EFIVars,
		"-drive", "if=virtio,format="+format+",file="+o.Disk,
		"-netdev", netdev(o),
		"-device", "virtio-net-pci,netdev=n0",
		"-serial", "file:"+o.ConsoleLog,
	)
	vm.cmd = exec.Command(qemu, args...)
	vm.cmd.Stderr = &vm.stderr
	// Its own process group: Ctrl-C in the terminal reaches the caller,
	// which shuts the node down cleanly, not QEMU, which would stop at once.
	vm.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := vm.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	go func() {
		err := vm.cmd.Wait()
		if err != nil {
			err = fmt.Errorf("qemu: %w: %s", err, strings.TrimSpace(vm.stderr.String()))
		}
		vm.err = err
		close(vm.done)
	}()
	return vm, nil
}

// Done is closed when QEMU has exited.
func (vm *VM) Done() <-chan struct{} { return vm.done }

// Wait waits for QEMU to exit and returns its error, if any.
func (vm *VM) Wait() error {
	<-vm.done
	return vm.err
}

// Kill stops QEMU at once, like pulling the power cord.
func (vm *VM) Kill() {
	vm.cmd.Process.Kill()
	<-vm.done
}

// WaitReady calls probe every second until it succeeds, QEMU exits or ctx
// ends. progress, if set, is called with the elapsed time and the last line
// of the console log after each failed probe.
func (vm *VM) WaitReady(ctx context.Context, probe func(context.Context) error, progress func(time.Duration, string)) error {
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := probe(pctx)
		cancel()
		if err == nil {
			return nil
		}
		if progress != nil {
			progress(time.Since(start), vm.LastConsoleLine())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node not ready after %s (last probe: %v); see %s", time.Since(start).Round(time.Second), err, vm.Opts.ConsoleLog)
		case <-vm.done:
			return fmt.Errorf("qemu exited before the node was ready: %v; see %s", vm.err, vm.Opts.ConsoleLog)
		case <-tick.C:
		}
	}
}

// LastConsoleLine returns the last non-empty line of the console log.
func (vm *VM) LastConsoleLine() string {
	raw, err := os.ReadFile(vm.Opts.ConsoleLog)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// diskFormat tells raw from qcow2 by the file's magic.
func diskFormat(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if bytes.Equal(magic, []byte("QFI\xfb")) {
		return "qcow2", nil
	}
	return "raw", nil
}

func copyFile(src, dst string) error {
	in, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, in, 0o644)
}

// netdev is QEMU's user network, forwarding the node's API and metrics
// ports from the host's loopback.
func netdev(o Options) string {
	s := fmt.Sprintf("user,id=n0,hostfwd=tcp:127.0.0.1:%d-:%d", o.APIPort, machineconfig.DefaultAPIPort)
	if o.MetricsPort != 0 {
		s += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", o.MetricsPort, machineconfig.DefaultMetricsPort)
	}
	return s
}
