// Command init is PID 1 of a Cairn node.
//
// Run from the initramfs (stage 1) it loads the boot modules, mounts the
// root squashfs with /etc as a tmpfs overlay and switches into it. Run from
// the root (stage 2) it mounts the system, loads the machine config from
// STATE, sets the hostname and network, and supervises the services; then it
// reaps orphans and serves the control socket until asked to power off or
// reboot. It never exits: a fatal error is logged and the node reboots.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "init: must run as PID 1 of a Cairn node")
		os.Exit(2)
	}
	slog.SetDefault(slog.New(newConsoleHandler(os.Stdout)))
	defer func() {
		if r := recover(); r != nil {
			fatal(fmt.Errorf("panic: %v\n%s", r, debug.Stack()))
		}
	}()
	var err error
	if _, statErr := os.Stat(rootImage); statErr == nil {
		err = stage1()
	} else {
		err = stage2()
	}
	fatal(err)
}

// fatal logs err and reboots: PID 1 must not exit, and a reboot gives the
// boot loader the chance to fall back to the last good image.
func fatal(err error) {
	slog.Error("fatal boot error, rebooting in 10s", "err", err)
	time.Sleep(10 * time.Second)
	unix.Sync()
	for {
		unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
		time.Sleep(time.Second)
	}
}
