package stage2

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/init/internal/ephemeral"
	"github.com/cairn-os/cairn/supervisor"
)

const varDir = "/var"

// prepareEphemeral makes EPHEMERAL on first boot (partition and a real
// mkfs), grows it when the disk has grown, checks it and mounts it on /var.
// It runs before STATE is mounted, so the kernel can re-read the partition
// table while no partition of the disk is in use.
func (n *node) prepareEphemeral() error {
	stateDev, err := findPartition(sysBlock, "STATE", partitionWait)
	if err != nil {
		return err
	}
	disk, err := parentDisk(stateDev)
	if err != nil {
		return err
	}
	res, err := ephemeral.Ensure(disk)
	if err != nil {
		return err
	}
	if res.Change != ephemeral.Unchanged {
		slog.Info("EPHEMERAL partition "+res.Change.String(), "disk", disk, "number", res.Number, "size", res.Size)
		if err := rereadPartitions(disk); err != nil {
			return err
		}
	}
	dev, err := findPartition(sysBlock, ephemeral.Label, partitionWait)
	if err != nil {
		return err
	}
	if res.Change == ephemeral.Created {
		if err := n.run("/sbin/mke2fs", "-q", "-t", "ext4", "-L", ephemeral.Label, "-F", dev); err != nil {
			return fmt.Errorf("make the EPHEMERAL filesystem on %s: %w", dev, err)
		}
	} else if err := n.fsck(dev); err != nil {
		return err
	}
	if err := boot.MountAll([]boot.Mount{{Source: dev, Target: varDir, FSType: "ext4", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: ""}}); err != nil {
		return err
	}
	n.addDisk(varDir)
	if res.Change == ephemeral.Grown {
		// Online: resize2fs grows a mounted ext4 without the forced full
		// check it wants offline.
		if err := n.run("/sbin/resize2fs", dev); err != nil {
			return fmt.Errorf("grow the EPHEMERAL filesystem on %s: %w", dev, err)
		}
	}
	for _, d := range []string{"/var/log", "/var/lib", "/var/run"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// fsck checks an ext4 filesystem, repairing what e2fsck repairs on its own.
// Exit status 1 (errors corrected) is fine; anything worse means the
// filesystem is not mounted.
func (n *node) fsck(dev string) error {
	err := n.run("/sbin/e2fsck", "-p", dev)
	if ee, ok := err.(*supervisor.ExitError); ok && ee.Exit.Status.ExitStatus() == 1 {
		slog.Warn("e2fsck corrected errors", "dev", dev)
		return nil
	}
	if err != nil {
		return fmt.Errorf("EPHEMERAL on %s is damaged (e2fsck: %w); reset the node to remake it", dev, err)
	}
	return nil
}

// run runs a helper program through the reaper, its output on the console.
func (n *node) run(path string, args ...string) error {
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	cmd.Env = []string{"PATH=/usr/bin:/sbin"}
	return n.reaper.Run(cmd)
}

// parentDisk returns the whole disk holding a partition device.
func parentDisk(part string) (string, error) {
	sys, err := filepath.EvalSymlinks(filepath.Join(sysBlock, filepath.Base(part)))
	if err != nil {
		return "", err
	}
	return "/dev/" + filepath.Base(filepath.Dir(sys)), nil
}

// rereadPartitions asks the kernel to load a disk's new partition table.
func rereadPartitions(disk string) error {
	f, err := os.Open(disk)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0); err != nil {
		return fmt.Errorf("re-read the partition table of %s: %w", disk, err)
	}
	return nil
}
