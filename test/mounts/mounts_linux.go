// Package mounts cleans up after tests whose node leaves mounts behind: a
// node's pods keep their volumes mounted (secret and projected volumes,
// memory emptyDirs on tmpfs, CSI volumes) when the agent stops without
// tearing them down, as it does when a test ends.
package mounts

import (
	"cmp"
	"slices"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// UnmountAtEnd has tb unmount, when it ends and before the directories
// made earlier with tb.TempDir are removed, whatever is still mounted
// under dir, the deepest first.
func UnmountAtEnd(tb testing.TB, dir string) {
	tb.Cleanup(func() {
		ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
		if err != nil {
			tb.Errorf("read the mounts under %s: %v", dir, err)
			return
		}
		slices.SortFunc(ms, func(a, b *mountinfo.Info) int { return cmp.Compare(len(b.Mountpoint), len(a.Mountpoint)) })
		for _, m := range ms {
			if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil {
				tb.Errorf("unmount %s: %v", m.Mountpoint, err)
			}
		}
	})
}
