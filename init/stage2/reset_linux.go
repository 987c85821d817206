package stage2

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/init/internal/ephemeral"
	"github.com/cairn-os/cairn/internal/atomicfile"
	"github.com/cairn-os/cairn/internal/layout"
)

// resetPlan is what the shutdown wipes once the disks are unmounted.
type resetPlan struct {
	wipeState bool
	// firstBoot is the image's machine config, written to the new STATE.
	firstBoot []byte
}

func (p *resetPlan) what() string {
	if p.wipeState {
		return "EPHEMERAL and STATE"
	}
	return "EPHEMERAL"
}

// reset plans the wipe and starts the shutdown that does it. No config
// change or upgrade may run meanwhile: it waits for none and refuses.
func (n *node) reset(req *machine.ResetRequest) (*machine.ResetResponse, error) {
	plan := &resetPlan{wipeState: req.WipeState}
	if req.WipeState {
		b, err := os.ReadFile(layout.FirstBootConfig)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "reset refused, nothing wiped: STATE has no first-boot config to boot on once wiped (%v): images built before it was kept have none; reset without --wipe-state", err)
		}
		plan.firstBoot = b
	}
	n.mu.Lock()
	cfgs, boots := n.configs, n.boots
	n.mu.Unlock()
	// Held until the node goes down.
	if cfgs != nil {
		if err := cfgs.lock(); err != nil {
			return nil, err
		}
	}
	if boots != nil {
		if err := boots.lock("a reset"); err != nil {
			if cfgs != nil {
				cfgs.mu.Unlock()
			}
			return nil, err
		}
	}
	cmd, then := unix.LINUX_REBOOT_CMD_RESTART, "rebooting"
	if req.Shutdown {
		cmd, then = unix.LINUX_REBOOT_CMD_POWER_OFF, "powering off"
	}
	n.mu.Lock()
	n.resetting = plan
	n.mu.Unlock()
	n.requestShutdown(cmd, "a reset")
	return &machine.ResetResponse{Outcome: fmt.Sprintf("stopping the node, wiping %s, then %s", plan.what(), then)}, nil
}

// wipe is the shutdown's reset step, once the disks are unmounted:
// EPHEMERAL leaves the partition table, its start zeroed (the next boot
// makes it anew, as at first boot); with wipeState STATE gets a new
// filesystem holding only the first-boot config.
func (n *node) wipe(p *resetPlan) error {
	stateDev, err := findPartition(sysBlock, "STATE", time.Second)
	if err != nil {
		return err
	}
	disk, err := parentDisk(stateDev)
	if err != nil {
		return err
	}
	removed, err := ephemeral.Remove(disk)
	if err != nil {
		return err
	}
	slog.Info("reset: EPHEMERAL wiped", "disk", disk, "was there", removed)
	if !p.wipeState {
		return nil
	}
	if err := n.run("/sbin/mke2fs", "-q", "-t", "ext4", "-L", "STATE", "-F", stateDev); err != nil {
		return fmt.Errorf("make a new STATE filesystem on %s: %w", stateDev, err)
	}
	if err := boot.MountAll([]boot.Mount{{Source: stateDev, Target: layout.StateDir, FSType: "ext4", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC}}); err != nil {
		return err
	}
	var errs []error
	for _, path := range []string{layout.FirstBootConfig, layout.MachineConfig} {
		errs = append(errs, atomicfile.WriteFile(path, p.firstBoot, 0o600))
	}
	if err := unix.Unmount(layout.StateDir, 0); err != nil {
		errs = append(errs, fmt.Errorf("unmount %s: %w", layout.StateDir, err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	slog.Info("reset: STATE wiped; the next boot is on the first-boot config", "files", strings.Join([]string{filepath.Base(layout.MachineConfig), filepath.Base(layout.FirstBootConfig)}, ", "))
	return nil
}
