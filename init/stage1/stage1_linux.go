package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/u-root/u-root/pkg/mount/loop"
	"golang.org/x/sys/unix"
)

const (
	rootImage = "/rootfs.sqsh"
	newRoot   = "/newroot"
	// overlayDir is a tmpfs in the new root holding the writable upper
	// layer of /etc.
	overlayDir = "/system/overlay"
)

// stage1 runs in the initramfs and ends by exec'ing stage 2 in the new root.
func stage1() error {
	tl := boot.NewTimeline(nil)
	err := boot.Sequence{Name: "stage 1", Steps: []boot.Step{
		{Name: "mount early filesystems", Run: mountEarly, Fatal: true},
		{Name: "load boot modules", Run: boot.LoadModules, Fatal: true},
		{Name: "mount root squashfs", Run: func() error { return mountRoot(rootImage, newRoot) }, Fatal: true},
		{Name: "mount /etc overlay", Run: func() error { return mountEtcOverlay(newRoot) }, Fatal: true},
	}}.Run(tl, nil)
	if err != nil {
		return err
	}
	return switchRoot(tl.Records())
}

func mountEarly() error {
	return boot.MountAll([]boot.Mount{
		{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: unix.MS_NOSUID, Data: "mode=0755"},
		{Source: "proc", Target: "/proc", FSType: "proc", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: ""},
		{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: ""},
	})
}

// mountRoot mounts the squashfs image read-only on dir, through a loop
// device.
func mountRoot(image, dir string) error {
	l, err := loop.New(image, "squashfs", "")
	if err != nil {
		return fmt.Errorf("attach %s to a loop device: %w", image, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if _, err := l.Mount(dir, unix.MS_RDONLY); err != nil {
		return fmt.Errorf("mount %s: %w", image, err)
	}
	return nil
}

// mountEtcOverlay makes root's /etc writable: an overlay whose upper layer
// is in a tmpfs on root's overlayDir, lost at each boot.
func mountEtcOverlay(root string) error {
	dir := filepath.Join(root, overlayDir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	upper, work := filepath.Join(dir, "etc"), filepath.Join(dir, ".etc-work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	etc := filepath.Join(root, "etc")
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", etc, upper, work)
	if err := unix.Mount("overlay", etc, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", etc, err)
	}
	return nil
}

// switchRoot moves the early mounts into the new root, makes it / and execs
// stage 2 there. pivot_root does not work on the initramfs root, so the new
// root is moved over / and entered with chroot.
func switchRoot(timeline []boot.Record) error {
	for _, m := range []string{"/dev", "/proc", "/sys"} {
		if err := unix.Mount(m, filepath.Join(newRoot, m), "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s into the new root: %w", m, err)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root to /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	tl, err := json.Marshal(timeline)
	if err != nil {
		return err
	}
	env := append(os.Environ(), boot.TimelineEnv+"="+string(tl))
	return fmt.Errorf("exec %s: %w", layout.InitBinary, unix.Exec(layout.InitBinary, []string{layout.InitBinary}, env))
}
