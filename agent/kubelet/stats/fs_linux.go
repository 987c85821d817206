package stats

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// fsCapacity is a filesystem's size and what is free of it.
type fsCapacity struct {
	capacity, available, free uint64 // bytes; available to unprivileged users
	inodes, inodesFree        uint64
}

func statfs(path string) (fsCapacity, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return fsCapacity{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := uint64(s.Bsize)
	return fsCapacity{capacity: s.Blocks * bs, available: s.Bavail * bs, free: s.Bfree * bs,
		inodes: s.Files, inodesFree: s.Ffree}, nil
}

// fsStats is the whole filesystem's usage at t, in values of its own.
func (c fsCapacity) fsStats(t time.Time) *statsv1alpha1.FsStats {
	used, inodesUsed := c.capacity-c.free, c.inodes-c.inodesFree
	return &statsv1alpha1.FsStats{Time: metav1.NewTime(t), CapacityBytes: &c.capacity, AvailableBytes: &c.available,
		UsedBytes: &used, Inodes: &c.inodes, InodesFree: &c.inodesFree, InodesUsed: &inodesUsed}
}
