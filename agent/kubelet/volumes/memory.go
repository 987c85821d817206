package volumes

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// tmpfsSource names the tmpfs mounts of the volumes kept in memory, so
// that TearDown unmounts those and nothing else.
const tmpfsSource = "cairn-volume"

// inMemory says whether v's files are kept in memory, on a tmpfs of their
// own, as the kubelet keeps them: a secret or projected volume (secrets,
// service-account tokens) never on the node's disk, and an emptyDir of
// medium Memory.
func inMemory(v *corev1.Volume) bool {
	return v.Secret != nil || v.Projected != nil || v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory
}

// mountTmpfs mounts a tmpfs of at most size bytes (0: the kernel's
// default, half the memory) at dir, made if need be, unless dir is a
// mount point already: Refresh writes again into the same one. The
// pages are charged to the memory cgroup of the container that writes
// them: a pod's memory-backed volume counts against its memory.
func mountTmpfs(dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if mounted, err := mountinfo.Mounted(dir); err != nil || mounted {
		return err
	}
	data := "mode=0755"
	if size > 0 {
		data += fmt.Sprintf(",size=%d", size)
	}
	if err := unix.Mount(tmpfsSource, dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount a tmpfs at %s: %w", dir, err)
	}
	return nil
}

// unmountTmpfs unmounts the volumes' tmpfs mounts under dir, the deepest
// first, and fails if anything else is still mounted there.
func unmountTmpfs(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("read the mounts: %w", err)
	}
	slices.SortFunc(mounts, func(a, b *mountinfo.Info) int { return cmp.Compare(len(b.Mountpoint), len(a.Mountpoint)) })
	var errs []error
	for _, m := range mounts {
		if m.FSType != "tmpfs" || m.Source != tmpfsSource {
			errs = append(errs, fmt.Errorf("%s is still mounted", m.Mountpoint))
			continue
		}
		if err := unix.Unmount(m.Mountpoint, 0); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m.Mountpoint, err))
		}
	}
	return errors.Join(errs...)
}
