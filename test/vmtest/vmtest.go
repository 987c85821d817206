// Package vmtest runs one Go test inside a small VM on Cairn's Debian
// kernel, for what the host's kernel cannot do (bonds, VLANs and other
// links whose drivers are modules there). A test starts with
//
//	if !vmtest.Run(t, vmtest.Options{Modules: []string{"bonding"}}) {
//		return
//	}
//
// On the host, Run builds the package's test binary and the guest init
// (./guest), packs them with the modules and their dependencies into an
// initramfs, boots the kernel with it in QEMU (no disk, no NIC), relays
// the guest's console into the test's log and fails the test if the test
// failed in the VM; it returns false. In the VM the guest init runs the
// test binary for that test alone, with EnvGuest set: Run returns true
// there and the test body runs.
package vmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/u-root/u-root/pkg/cpio"

	"github.com/cairn-os/cairn/qemu"
	"github.com/cairn-os/cairn/rootfs"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/vmtest/internal/protocol"
)

// EnvGuest is set in the environment of the test binary in the VM.
const EnvGuest = protocol.EnvGuest

// Options of one VM test.
type Options struct {
	// Modules are the kernel modules the test needs, by name; their
	// dependencies (modules.dep) come along.
	Modules []string
	// Timeout bounds the whole VM, boot to power-off (default 3 min).
	Timeout time.Duration
	// MemoryMiB is the VM's memory (default 512).
	MemoryMiB int
}

// Run returns true at once in the VM: the test body runs there. On the
// host it runs the calling test in a VM, fails it if the test failed
// there or the VM did not end within the timeout, and returns false: the
// body must not run on the host.
func Run(t *testing.T, o Options) bool {
	t.Helper()
	if os.Getenv(EnvGuest) != "" {
		return true
	}
	err := run(t, ".", testPattern(t.Name()), o, func(s string) { t.Log(s) })
	var skipped skippedError
	if errors.As(err, &skipped) {
		need.Missing(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return false
}

// skippedError says the test skipped in the VM: it skips on the host too
// (fails under need.EnvNoSkip), so that a pass never hides a body that
// did not run.
type skippedError struct{ line string }

func (e skippedError) Error() string { return "the test skipped in the VM: " + e.line }

// testPattern is the -test.run pattern matching the test (or subtest)
// named name alone.
func testPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// run boots the test binary of the package in pkgDir in a VM and runs the
// tests matching pattern there, telling log what it does and each line of
// the guest's console. It returns an error if they failed or the VM did
// not end in time.
func run(t *testing.T, pkgDir, pattern string, o Options, log func(string)) error {
	t.Helper()
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 512
	}
	need.Tool(t, "qemu-system-x86_64", "qemu-system-x86")
	goTool := need.Tool(t, "go", "golang-go")
	xz := need.Tool(t, "xz", "xz-utils")
	k, err := rootfs.FetchKernel(context.Background(), rootfs.DefaultCacheDir(), func(s string) { log("vmtest: " + s) })
	if err != nil {
		need.Missing(t, "needs the kernel package %s=%s: %v", rootfs.KernelPackage, rootfs.KernelVersion, err)
	}
	mods, err := rootfs.ResolveModules(k.ModulesDir(), o.Modules)
	if err != nil {
		return err
	}
	kernel, err := vmlinux(xz, k)
	if err != nil {
		return err
	}

	dir := t.TempDir()
	start := time.Now()
	log("vmtest: building the test binary of " + pkgDir + " and the guest init")
	testBin, guestBin := filepath.Join(dir, "test"), filepath.Join(dir, "init")
	// Without symbol tables and DWARF (stacks keep their lines), linking
	// is faster and the initramfs a third smaller.
	if err := goBuild(goTool, pkgDir, "test", "-c", "-ldflags=-s -w", "-o", testBin, "."); err != nil {
		return err
	}
	if err := goBuild(goTool, ".", "build", "-ldflags=-s -w", "-o", guestBin, "github.com/cairn-os/cairn/test/vmtest/guest"); err != nil {
		return err
	}
	// The test's own timeout comes first, with its goroutines' stacks.
	c := protocol.Config{Test: pattern, Timeout: (o.Timeout * 3 / 4).String()}
	if v := os.Getenv(need.EnvNoSkip); v != "" {
		c.Env = append(c.Env, need.EnvNoSkip+"="+v)
	}
	files := map[string]string{"init": guestBin, strings.TrimPrefix(protocol.TestBinary, "/"): testBin}
	for _, m := range mods {
		name := path.Join("lib/modules", k.Release, m)
		files[name] = filepath.Join(k.ModulesDir(), m)
		c.Modules = append(c.Modules, "/"+name)
	}
	initrd := filepath.Join(dir, "initramfs.cpio")
	if err := writeInitramfs(initrd, files, c); err != nil {
		return err
	}
	log(fmt.Sprintf("vmtest: built in %s; booting %s with %d modules", time.Since(start).Round(100*time.Millisecond), k.Release, len(mods)))

	vm, err := qemu.Start(qemu.Options{
		Kernel:     &qemu.KernelBoot{Kernel: kernel, Initrd: initrd, Append: "console=ttyS0 quiet panic=-1"},
		ConsoleLog: filepath.Join(dir, "console.log"),
		MemoryMiB:  o.MemoryMiB,
		CPUs:       1,
		Notify:     func(s string) { log("vmtest: " + s) },
	})
	if err != nil {
		return fmt.Errorf("boot the VM: %w", err)
	}
	log(fmt.Sprintf("vmtest: running %s in the VM (%s)", pattern, vm.Accel()))
	result, skip, err := relay(vm, o.Timeout, log)
	if err != nil {
		return err
	}
	log(fmt.Sprintf("vmtest: the VM ended %s after the build started", time.Since(start).Round(100*time.Millisecond)))
	if result != "PASS" {
		return fmt.Errorf("%s in the VM: %s", pattern, result)
	}
	if skip != "" {
		return skippedError{skip}
	}
	return nil
}

// goBuild runs go with args in dir, for a static binary of the VM.
func goBuild(goTool, dir string, args ...string) error {
	cmd := exec.Command(goTool, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s in %s: %w\n%s", strings.Join(args, " "), dir, err, out)
	}
	return nil
}

// writeInitramfs writes a newc archive of files (name in the archive to
// host path), the config and /dev/console, which the kernel opens as
// init's stdio before init runs.
func writeInitramfs(out string, files map[string]string, c protocol.Config) error {
	conf, err := json.Marshal(c)
	if err != nil {
		return err
	}
	records := []cpio.Record{
		cpio.CharDev("dev/console", 0o600, 5, 1),
		cpio.StaticFile(strings.TrimPrefix(protocol.ConfigPath, "/"), string(conf), 0o644),
	}
	for name, src := range files {
		data, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		records = append(records, cpio.StaticRecord(data, cpio.Info{Name: name, Mode: cpio.S_IFREG | 0o755}))
	}
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer f.Close()
	w := cpio.Newc.Writer(f)
	if err := cpio.WriteRecordsAndDirs(w, records); err != nil {
		return fmt.Errorf("initramfs %s: %w", out, err)
	}
	if err := cpio.WriteTrailer(w); err != nil {
		return fmt.Errorf("initramfs %s: %w", out, err)
	}
	return f.Close()
}

// relay logs the VM's console line by line until QEMU exits, and returns
// what the guest's result line says and the line saying that the test
// skipped, if it did. It kills the VM after timeout.
func relay(vm *qemu.VM, timeout time.Duration, log func(string)) (result, skip string, err error) {
	c := &consoleLines{log: log}
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	// read takes what QEMU wrote to the console since the last call. A
	// VM started again (KVM could not run it: TCG now) writes a new file
	// at the path, which is read from its start.
	read := func() {
		if f != nil {
			more, _ := io.ReadAll(f)
			c.add(more)
			old, err1 := f.Stat()
			now, err2 := os.Stat(vm.Opts.ConsoleLog)
			if err1 != nil || err2 != nil || os.SameFile(old, now) {
				return
			}
			f.Close()
			f = nil
		}
		opened, err := os.Open(vm.Opts.ConsoleLog)
		if err != nil {
			return // QEMU has not created it yet
		}
		f = opened
		more, _ := io.ReadAll(f)
		c.add(more)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-vm.Done():
			read()
			c.end()
			if err := vm.Wait(); err != nil {
				return "", "", fmt.Errorf("the VM failed: %w", err)
			}
			if c.result == "" {
				return "", "", errors.New("the VM ended without the test's result: see the guest's console above")
			}
			return c.result, c.skip, nil
		case <-deadline.C:
			vm.Kill()
			read()
			c.end()
			return "", "", fmt.Errorf("the VM did not end within %s: see the guest's console above", timeout)
		case <-tick.C:
			read()
		}
	}
}

// consoleLines splits the guest's console into lines for log, and keeps
// what the guest's result line says and the line saying that the test
// (not a subtest: its line is indented) skipped.
type consoleLines struct {
	log          func(string)
	pending      []byte
	result, skip string
}

// add takes more of the console; a line is logged once it is complete.
func (c *consoleLines) add(p []byte) {
	c.pending = append(c.pending, p...)
	for {
		i := bytes.IndexByte(c.pending, '\n')
		if i < 0 {
			return
		}
		c.line(string(c.pending[:i]))
		c.pending = c.pending[i+1:]
	}
}

// end logs the last line, if the console did not end with a newline.
func (c *consoleLines) end() {
	if len(c.pending) > 0 {
		c.line(string(c.pending))
		c.pending = nil
	}
}

func (c *consoleLines) line(l string) {
	l = strings.TrimRight(l, "\r")
	if r, ok := strings.CutPrefix(l, protocol.ResultPrefix); ok {
		c.result = r
	}
	if strings.HasPrefix(l, "--- SKIP: ") {
		c.skip = l
	}
	c.log("guest: " + l)
}
