package boot

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"
)

// Mount is one mount(2) call.
type Mount struct {
	Source, Target, FSType string
	Flags                  uintptr
	Data                   string
}

// MountAll makes each target directory and mounts on it, in order.
func MountAll(ms []Mount) error {
	for _, m := range ms {
		if err := os.MkdirAll(m.Target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.FSType, m.Target, err)
		}
	}
	return nil
}

// Fatal logs err and reboots: PID 1 must not exit, and a reboot gives the
// boot loader the chance to fall back to the last good image.
func Fatal(err error) {
	slog.Error("fatal boot error, rebooting in 10s", "err", err)
	time.Sleep(10 * time.Second)
	unix.Sync()
	for {
		unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
		time.Sleep(time.Second)
	}
}

// Main runs a stage of init as PID 1: the console as the log, and run's
// error or panic ending in Fatal, never in an exit.
func Main(name string, run func() error) {
	if os.Getpid() != 1 {
		fmt.Fprintf(os.Stderr, "%s: must run as PID 1 of a Cairn node\n", name)
		os.Exit(2)
	}
	slog.SetDefault(slog.New(NewConsoleHandler(os.Stdout)))
	defer func() {
		if r := recover(); r != nil {
			Fatal(fmt.Errorf("panic: %v\n%s", r, debug.Stack()))
		}
	}()
	Fatal(run())
}
