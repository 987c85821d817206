// Command stage1 is /init in a Cairn initramfs, PID 1 for its first second:
// it mounts /dev /proc /sys, loads the boot modules, mounts the root
// squashfs read-only with /etc as a tmpfs overlay, switches into it and
// execs the real init there, handing over its boot timeline. It is kept
// apart from init so the initramfs stays small.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/cairn-os/cairn/init/internal/boot"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "stage1: must run as PID 1 from a Cairn initramfs")
		os.Exit(2)
	}
	slog.SetDefault(slog.New(boot.NewConsoleHandler(os.Stdout)))
	defer func() {
		if r := recover(); r != nil {
			boot.Fatal(fmt.Errorf("panic: %v\n%s", r, debug.Stack()))
		}
	}()
	boot.Fatal(stage1())
}
