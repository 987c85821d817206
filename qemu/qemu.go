// Package qemu boots Cairn disk images in QEMU: UEFI firmware (OVMF), a
// virtio disk and NIC, user networking with ports forwarded to loopback, and
// the serial console written to a log file. KVM is used when guest code
// really runs under it (a probe, then the real guest watched); otherwise
// QEMU runs with software emulation (TCG).
package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/cairn-os/cairn/machineconfig"
)

// HostAddress is the host as a guest on QEMU's user networking sees it:
// the guest's packets to it arrive on the host's loopback.
const HostAddress = "10.0.2.2"

// Firmware paths of Debian's ovmf package: read-only code and a template
// for the writable variable store.
const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	// ovmfSecureCode enforces Secure Boot once keys are enrolled; it needs
	// SMM, so that only the firmware writes its variables.
	ovmfSecureCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	ovmfVars       = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// Options describe one VM.
type Options struct {
	Disk string // raw or qcow2 image; booted in place
	// Attach are raw images attached read-only after Disk, as virtio
	// disks: a NoCloud volume (cairn image cidata).
	Attach []string
	// CDROM is an ISO in a CD-ROM drive (cairn image build --format
	// iso). The firmware boots from Disk first, from the CD-ROM when
	// Disk has nothing to boot: an ISO installs onto an empty Disk, then
	// the VM boots the disk.
	CDROM string
	// SecureBoot boots OVMF's Secure Boot firmware. A new variable store
	// starts in setup mode, where an image built with --secure-boot has
	// systemd-boot enroll its keys; from then on the firmware boots only
	// what they signed.
	SecureBoot bool
	APIPort    int // host port on 127.0.0.1 forwarded to the node's API (50000)
	// MetricsPort, if not 0, is the host port on 127.0.0.1 forwarded to
	// the node's metrics (50001).
	MetricsPort int
	// Taps are more NICs, each on a tap device the caller opened, after
	// the user-networking one.
	Taps       []Tap
	MemoryMiB  int    // default 2048
	CPUs       int    // default 2
	ConsoleLog string // default Disk + ".console.log"
	EFIVars    string // writable OVMF variable store, default Disk + ".efivars"; kept across runs
	// IsolatedNIC adds a second virtio NIC on a network of its own where
	// nothing answers: DHCP on it times out.
	IsolatedNIC bool
	// Accel is auto (the default, or $CAIRN_QEMU_ACCEL), kvm or tcg.
	Accel string
	// Silence is how long a KVM guest's console may stay empty before
	// auto gives up on KVM and starts the VM again with TCG (default 30 s;
	// the firmware writes to the console within a second or two).
	Silence time.Duration
	// Stall is how long WaitReady lets the console stay unchanged while
	// the node is not ready before it gives up with the reason (default
	// 3 min).
	Stall time.Duration
	// Notify, if set, is told in one line when the VM falls back to TCG.
	Notify func(string)
	// Kernel, if set, is booted directly instead of Disk: no firmware, no
	// disk, no NIC, and QEMU exits when the guest powers off or reboots.
	// Set ConsoleLog too: its default is named after Disk.
	Kernel *KernelBoot
}

// Tap is a NIC on an open tap device (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR),
// such as one on a bridge in a network namespace: QEMU gets the file
// descriptor, so it needs neither the device's name nor its namespace.
type Tap struct {
	File *os.File
	MAC  net.HardwareAddr // unique on the tap's network
}

// KernelBoot is a kernel QEMU boots directly, with its initramfs and
// command line.
type KernelBoot struct{ Kernel, Initrd, Append string }

// VM is a running QEMU process.
type VM struct {
	Opts Options
	qemu string
	qmp  string // QMP socket of the monitor

	mu     sync.Mutex
	accel  string // "kvm" or "tcg"
	why    string // why TCG was chosen, if auto chose it
	cmd    *exec.Cmd
	stderr *watchedBuffer
	killed bool

	done chan struct{}
	err  error
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
	if o.Accel == "" {
		o.Accel = DefaultAccel()
	}
	if o.Silence == 0 {
		o.Silence = 30 * time.Second
	}
	if o.Stall == 0 {
		o.Stall = 3 * time.Minute
	}
	if o.Notify == nil {
		o.Notify = func(string) {}
	}
}

// Start boots the VM and returns once QEMU runs. With accel auto it runs
// KVM only if a probe's guest code runs under it, and starts again with
// TCG if the real guest then fails under KVM (a KVM internal error on
// QEMU's stderr, or a console that stays silent): Notify says so.
func Start(o Options) (*VM, error) {
	vm, err := newVM(o)
	if err != nil {
		return nil, err
	}
	var attempts []attempt
	switch vm.Opts.Accel {
	case AccelTCG:
		attempts = []attempt{{accel: AccelTCG}}
	case AccelKVM:
		// Asked for: no fallback, but a KVM that fails is an error, not a hang.
		attempts = []attempt{{accel: AccelKVM, watch: true}}
	default:
		if ok, why := ProbeKVM(context.Background(), vm.qemu); ok {
			attempts = []attempt{{accel: AccelKVM, watch: true}, {accel: AccelTCG}}
		} else {
			vm.why = "KVM cannot run guest code here (" + why + "); using TCG"
			vm.Opts.Notify(vm.why)
			attempts = []attempt{{accel: AccelTCG}}
		}
	}
	return vm, vm.start(attempts)
}

// newVM checks the host and the options for a VM not yet started.
func newVM(o Options) (*VM, error) {
	o.setDefaults()
	if err := checkAccel(o.Accel); err != nil {
		return nil, err
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, errors.New("qemu-system-x86_64 not found: install the Debian package qemu-system-x86")
	}
	if o.Kernel != nil {
		return &VM{Opts: o, qemu: qemu, qmp: o.ConsoleLog + ".qmp", accel: o.Accel, done: make(chan struct{})}, nil
	}
	for _, f := range []string{firmware(o), ovmfVars} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%s missing: install the Debian package ovmf", f)
		}
	}
	if _, err := os.Stat(o.EFIVars); errors.Is(err, os.ErrNotExist) {
		if err := copyFile(ovmfVars, o.EFIVars); err != nil {
			return nil, err
		}
	}
	return &VM{Opts: o, qemu: qemu, qmp: o.Disk + ".qmp", accel: o.Accel, done: make(chan struct{})}, nil
}

// attempt is one way to start QEMU: an accelerator, and whether to watch
// it for a guest that cannot run (then the next attempt is made).
type attempt struct {
	accel string
	watch bool
	extra []string // more arguments (tests)
}

// start runs the attempts in turn from one goroutine that owns the QEMU
// process: it is locked to its OS thread, so Pdeathsig kills QEMU when
// this process dies, however it dies. It returns once the first QEMU has
// started.
func (vm *VM) start(attempts []attempt) error {
	var format string
	if vm.Opts.Kernel == nil {
		var err error
		if format, err = diskFormat(vm.Opts.Disk); err != nil {
			return err
		}
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with QEMU's owner
		var err error
		for i, a := range attempts {
			var failed string
			failed, err = vm.run(a, format, started)
			if failed == "" || i == len(attempts)-1 {
				if failed != "" {
					err = errors.New(failed)
				}
				break
			}
			vm.mu.Lock()
			vm.why = failed + "; using " + strings.ToUpper(attempts[i+1].accel)
			vm.mu.Unlock()
			vm.Opts.Notify(vm.why)
		}
		vm.err = err
		close(vm.done)
	}()
	return <-started
}

// run starts QEMU with a and waits for it to exit. It returns why the
// guest could not run if a watched VM failed (QEMU is then stopped), and
// QEMU's error otherwise. The first successful start is sent to started.
func (vm *VM) run(a attempt, format string, started chan<- error) (failed string, err error) {
	os.Remove(vm.Opts.ConsoleLog)
	os.Remove(vm.qmp)
	args := append(accelArgs(a.accel),
		"-machine", machine(vm.Opts),
		"-smp", strconv.Itoa(vm.Opts.CPUs),
		"-m", strconv.Itoa(vm.Opts.MemoryMiB),
		"-nodefaults", "-display", "none", "-vga", "none",
		"-serial", "file:"+vm.Opts.ConsoleLog,
		"-qmp", "unix:"+vm.qmp+",server=on,wait=off",
	)
	if k := vm.Opts.Kernel; k != nil {
		args = append(args, "-kernel", k.Kernel, "-initrd", k.Initrd, "-append", k.Append, "-no-reboot")
	} else {
		args = append(args,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+firmware(vm.Opts),
			"-drive", "if=pflash,format=raw,unit=1,file="+vm.Opts.EFIVars,
			"-drive", "if=none,id=disk0,format="+format+",file="+vm.Opts.Disk,
			"-device", "virtio-blk-pci,drive=disk0,bootindex=0",
			"-netdev", netdev(vm.Opts),
			"-device", "virtio-net-pci,netdev=n0",
		)
		if vm.Opts.SecureBoot {
			// Only code in SMM writes the variable store's flash.
			args = append(args, "-global", "driver=cfi.pflash01,property=secure,value=on")
		}
		if vm.Opts.CDROM != "" {
			// q35's AHCI controller: the node's ahci and sr_mod drivers.
			args = append(args, "-drive", "if=none,id=cd0,media=cdrom,readonly=on,format=raw,file="+vm.Opts.CDROM,
				"-device", "ide-cd,drive=cd0,bus=ide.0,bootindex=1")
		}
		for _, f := range vm.Opts.Attach {
			args = append(args, "-drive", "if=virtio,format=raw,readonly=on,file="+f)
		}
	}
	var files []*os.File
	for i, t := range vm.Opts.Taps {
		id := "tap" + strconv.Itoa(i)
		args = append(args, "-netdev", fmt.Sprintf("tap,id=%s,fd=%d,vhost=off", id, 3+len(files)),
			"-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s", id, t.MAC))
		files = append(files, t.File)
	}
	if vm.Opts.IsolatedNIC {
		// A hub with nothing else on it: frames go nowhere, DHCP times out.
		args = append(args, "-netdev", "hubport,id=n1,hubid=1", "-device", "virtio-net-pci,netdev=n1")
	}
	args = append(args, a.extra...)
	cmd := exec.Command(vm.qemu, args...)
	cmd.ExtraFiles = files
	stderr := &watchedBuffer{}
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: Ctrl-C in the terminal reaches the
		// caller, which shuts the node down cleanly, not QEMU, which would
		// stop at once.
		Setpgid: true,
		// QEMU never outlives the program that started it.
		Pdeathsig: syscall.SIGKILL,
	}
	vm.mu.Lock()
	if vm.killed {
		vm.mu.Unlock()
		return "", errors.New("qemu: killed")
	}
	err = cmd.Start()
	if err == nil {
		vm.cmd, vm.stderr, vm.accel = cmd, stderr, a.accel
	}
	vm.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("start qemu: %w", err)
		select {
		case started <- err:
		default:
		}
		return "", err
	}
	select {
	case started <- nil:
	default:
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if a.watch {
		if failed = vm.watch(stderr, exited); failed != "" {
			cmd.Process.Kill()
			<-exited
			vm.mu.Lock()
			killed := vm.killed
			vm.mu.Unlock()
			if killed {
				return "", errors.New("qemu: killed")
			}
			return failed, nil
		}
	}
	if err := <-exited; err != nil {
		return "", fmt.Errorf("qemu: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return "", nil
}

// watch waits until the guest shows it runs (its console has output) or
// QEMU exits, and returns why the guest cannot run if it does neither: a
// KVM failure on QEMU's stderr, or a console silent for Opts.Silence.
func (vm *VM) watch(stderr *watchedBuffer, exited chan error) string {
	deadline := time.After(vm.Opts.Silence)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			exited <- err // for run's own wait
			if line := kvmFailure(stderr.String()); line != "" {
				return "KVM cannot run this guest here (" + line + ")"
			}
			if st, serr := os.Stat(vm.Opts.ConsoleLog); err != nil && (serr != nil || st.Size() == 0) {
				// It failed before the guest wrote anything.
				return fmt.Sprintf("KVM cannot run this guest here (qemu: %v%s)", err, firstLine(": ", stderr.String()))
			}
			return ""
		case <-deadline:
			return fmt.Sprintf("KVM cannot run this guest here (its console stayed silent for %s%s)", vm.Opts.Silence, firstLine("; qemu: ", stderr.String()))
		case <-tick.C:
			if line := kvmFailure(stderr.String()); line != "" {
				return "KVM cannot run this guest here (" + line + ")"
			}
			if st, err := os.Stat(vm.Opts.ConsoleLog); err == nil && st.Size() > 0 {
				return ""
			}
		}
	}
}

// Accel is the accelerator QEMU runs with now: "kvm" or "tcg".
func (vm *VM) Accel() string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.accel
}

// Fallback says why the VM runs with TCG although KVM was tried or
// present, or is "".
func (vm *VM) Fallback() string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.why
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
	vm.mu.Lock()
	vm.killed = true
	if vm.cmd != nil {
		vm.cmd.Process.Kill()
	}
	vm.mu.Unlock()
	<-vm.done
}

// Powerdown presses the VM's ACPI power button, as QEMU's monitor command
// system_powerdown does: a node powers off cleanly.
func (vm *VM) Powerdown() error {
	mon, err := qmp.NewSocketMonitor("unix", vm.qmp, 5*time.Second)
	if err != nil {
		return fmt.Errorf("qemu monitor %s: %w", vm.qmp, err)
	}
	if err := mon.Connect(); err != nil {
		return fmt.Errorf("qemu monitor %s: %w", vm.qmp, err)
	}
	defer mon.Disconnect()
	if _, err := mon.Run([]byte(`{"execute":"system_powerdown"}`)); err != nil {
		return fmt.Errorf("system_powerdown: %w", err)
	}
	return nil
}

// WaitReady calls probe every second until it succeeds, QEMU exits or ctx
// ends; waitingFor names what probe waits for. progress, if set, is called
// after each failed probe with the elapsed time and a line saying what it
// waits for and the console's last line. A boot that makes no progress —
// the console unchanged for Opts.Stall — fails at once with QEMU's stderr and
// the console's last lines. The guest kernel's reports of a stuck CPU do
// not count as progress: they repeat for as long as nothing moves.
func (vm *VM) WaitReady(ctx context.Context, waitingFor string, probe func(context.Context) error, progress func(time.Duration, string)) error {
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastMark, lastChange := -1, time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := probe(pctx)
		cancel()
		if err == nil {
			return nil
		}
		if mark := progressMark(vm.consoleLines()); mark != lastMark {
			lastMark, lastChange = mark, time.Now()
		}
		if progress != nil {
			line := "waiting for " + waitingFor + " (" + vm.Accel() + ")"
			if c := vm.LastConsoleLine(); c != "" {
				line += ": " + c
			}
			progress(time.Since(start), line)
		}
		if time.Since(lastChange) > vm.Opts.Stall {
			return fmt.Errorf("node makes no progress: its console has not changed for %s while waiting for %s (last probe: %v)%s%s%s; see %s",
				vm.Opts.Stall, waitingFor, err, vm.qemuStderr(), vm.vcpuState(), vm.ConsoleTail(5), vm.Opts.ConsoleLog)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node not ready after %s waiting for %s (last probe: %v)%s; see %s", time.Since(start).Round(time.Second), waitingFor, err, vm.ConsoleTail(5), vm.Opts.ConsoleLog)
		case <-vm.done:
			return fmt.Errorf("qemu exited before the node was ready: %v%s; see %s", vm.err, vm.ConsoleTail(5), vm.Opts.ConsoleLog)
		case <-tick.C:
		}
	}
}

// vcpuState asks QEMU's monitor, for a boot that makes no progress, how
// its virtual CPUs stand: whether QEMU runs the guest at all, and where
// each CPU is (instruction pointer, halted or not), twice a second apart,
// so that a guest spinning, idle or not run can be told apart.
func (vm *VM) vcpuState() string {
	mon, err := qmp.NewSocketMonitor("unix", vm.qmp, 2*time.Second)
	if err == nil {
		err = mon.Connect()
	}
	if err != nil {
		return "\nqemu monitor: " + err.Error()
	}
	defer mon.Disconnect()
	var b strings.Builder
	var status struct {
		Return struct {
			Status string `json:"status"`
		} `json:"return"`
	}
	if out, err := mon.Run([]byte(`{"execute":"query-status"}`)); err == nil && json.Unmarshal(out, &status) == nil {
		fmt.Fprintf(&b, "\nqemu status: %s", status.Return.Status)
	}
	for i := range 2 {
		if i > 0 {
			time.Sleep(time.Second)
		}
		out, err := mon.Run([]byte(`{"execute":"human-monitor-command","arguments":{"command-line":"info registers -a"}}`))
		var regs struct {
			Return string `json:"return"`
		}
		if err != nil || json.Unmarshal(out, &regs) != nil {
			continue
		}
		b.WriteString("\nvCPUs:")
		for _, line := range strings.Split(regs.Return, "\n") {
			line = strings.TrimSpace(line)
			switch f := strings.Fields(line); {
			case strings.HasPrefix(line, "CPU#"):
				b.WriteString(" " + line)
			case strings.HasPrefix(line, "RIP="), strings.HasPrefix(line, "EIP="): // long mode, or not yet
				b.WriteString(" " + f[0])
				for _, x := range f {
					if strings.HasPrefix(x, "HLT=") {
						b.WriteString(" " + x)
					}
				}
				b.WriteString(";")
			}
		}
	}
	return b.String()
}

func (vm *VM) qemuStderr() string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.stderr == nil {
		return ""
	}
	if s := strings.TrimSpace(vm.stderr.String()); s != "" {
		return "\nqemu said: " + s
	}
	return ""
}

// ConsoleTail is the console log's last n non-empty lines, indented, or
// a note that it is empty.
func (vm *VM) ConsoleTail(n int) string {
	lines := vm.consoleLines()
	if len(lines) == 0 {
		return "\nthe console is empty"
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\nconsole:\n  " + strings.Join(lines, "\n  ")
}

func (vm *VM) consoleLines() []string {
	raw, err := os.ReadFile(vm.Opts.ConsoleLog)
	if err != nil {
		return nil
	}
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		// The firmware clears the screen with terminal escapes.
		if l = strings.TrimSpace(terminalEscape.ReplaceAllString(l, "")); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// progressMark counts the console lines that show the guest doing
// something: all but the kernel's reports of a CPU stuck in a soft lockup
// or an RCU stall, which it prints every half minute while stuck.
func progressMark(lines []string) int {
	n := 0
	for _, l := range lines {
		if !stuckReport.MatchString(l) {
			n++
		}
	}
	return n
}

var stuckReport = regexp.MustCompile(`watchdog: BUG: soft lockup - CPU#\d+ stuck|rcu: INFO: rcu_\w+ detected stalls`)

// terminalEscape matches a terminal control sequence (CSI).
var terminalEscape = regexp.MustCompile(`\x1b\[[0-9;=?]*[A-Za-z]`)

// LastConsoleLine returns the last non-empty line of the console log.
func (vm *VM) LastConsoleLine() string {
	lines := vm.consoleLines()
	if len(lines) == 0 {
		return ""
	}
	return lines[len(lines)-1]
}

// watchedBuffer is QEMU's stderr, read while QEMU writes it.
type watchedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *watchedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *watchedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
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

// machine is QEMU's -machine for o: q35, with SMM for Secure Boot.
func machine(o Options) string {
	if o.SecureBoot {
		return "q35,smm=on"
	}
	return "q35"
}

// firmware is the OVMF code o boots.
func firmware(o Options) string {
	if o.SecureBoot {
		return ovmfSecureCode
	}
	return ovmfCode
}
