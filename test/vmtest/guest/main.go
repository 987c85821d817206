// Command guest is the /init of a vmtest VM: it mounts the kernel's
// filesystems, loads the modules the test needs, runs the one test of the
// test binary with its output on the console, writes how the test ended,
// and powers the VM off.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/u-root/u-root/pkg/kmodule"
	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/test/vmtest/internal/protocol"
)

func main() {
	if err := run(); err != nil {
		fmt.Printf("\n%sFAIL: %v\n", protocol.ResultPrefix, err)
	} else {
		fmt.Printf("\n%sPASS\n", protocol.ResultPrefix)
	}
	unix.Sync()
	// QEMU runs with -no-reboot: powering off ends it. PID 1 must not
	// exit, so it waits if the power-off fails.
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Printf("power off: %v\n", err)
	}
	select {}
}

func run() error {
	for _, m := range []struct{ fstype, dir string }{
		{"proc", "/proc"}, {"sysfs", "/sys"}, {"devtmpfs", "/dev"}, {"tmpfs", "/tmp"}, {"tmpfs", "/run"},
	} {
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, m.dir, m.fstype, unix.MS_NOSUID, ""); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dir, err)
		}
	}
	raw, err := os.ReadFile(protocol.ConfigPath)
	if err != nil {
		return err
	}
	var c protocol.Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("%s: %w", protocol.ConfigPath, err)
	}
	for _, mod := range c.Modules {
		if err := loadModule(mod); err != nil {
			return err
		}
	}
	cmd := exec.Command(protocol.TestBinary, "-test.run", c.Test, "-test.v", "-test.count=1", "-test.timeout", c.Timeout)
	cmd.Dir = "/tmp"
	cmd.Env = append([]string{"PATH=/sbin:/bin", "HOME=/tmp", "TMPDIR=/tmp", protocol.EnvGuest + "=1"}, c.Env...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("test binary: %w", err)
	}
	return nil
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := kmodule.FileInit(f, "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", filepath.Base(path), err)
	}
	return nil
}
