package volumes

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// OverLimit reports the first emptyDir of pod on the node's disk whose
// files take more than its sizeLimit, the kubelet's reason to evict the
// pod: its name and limit. An emptyDir of medium Memory cannot
// pass its limit, which is its tmpfs's size.
func (m *Manager) OverLimit(pod *corev1.Pod) (name string, limit resource.Quantity, over bool) {
	for _, v := range pod.Spec.Volumes {
		e := v.EmptyDir
		if e == nil || e.SizeLimit == nil || e.Medium == corev1.StorageMediumMemory {
			continue
		}
		dir := filepath.Join(m.Root, string(pod.UID), "volumes", "kubernetes.io~empty-dir", v.Name)
		n, err := diskUsage(dir)
		if err != nil {
			continue // not made yet, or going
		}
		if n > e.SizeLimit.Value() {
			return v.Name, *e.SizeLimit, true
		}
	}
	return "", resource.Quantity{}, false
}

// diskUsage is what the files under dir take on disk, as du counts it:
// the blocks allocated, links not followed.
func diskUsage(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("disk usage of %s: %w", dir, err)
	}
	return n, nil
}
