package stats

import (
	"fmt"
	"time"

	"github.com/prometheus/procfs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// nodeStats reads the host's usage: CPU from /proc/stat, memory from
// /proc/meminfo, network from /proc/net/dev, the node's filesystem and
// the runtime's image filesystem.
func (p *Provider) nodeStats(r *reading, onlyCPUAndMemory bool) (statsv1alpha1.NodeStats, error) {
	proc, err := procfs.NewDefaultFS()
	if err != nil {
		return statsv1alpha1.NodeStats{}, fmt.Errorf("node stats: %w", err)
	}
	now := time.Now()
	st, err := proc.Stat()
	if err != nil {
		return statsv1alpha1.NodeStats{}, fmt.Errorf("node CPU: %w", err)
	}
	mi, err := proc.Meminfo()
	if err != nil {
		return statsv1alpha1.NodeStats{}, fmt.Errorf("node memory: %w", err)
	}
	mem, err := nodeMemory(mi, now)
	if err != nil {
		return statsv1alpha1.NodeStats{}, err
	}
	n := statsv1alpha1.NodeStats{
		NodeName:  p.cfg.NodeName,
		StartTime: metav1.NewTime(time.Unix(int64(st.BootTime), 0)),
		CPU:       p.nodeCPU(st.CPUTotal, now),
		Memory:    mem,
	}
	if onlyCPUAndMemory {
		return n, nil
	}
	if n.Network, err = nodeNetwork(proc, now); err != nil {
		return statsv1alpha1.NodeStats{}, err
	}
	n.Fs = r.nodeFsCap.fsStats(now)
	if r.imageFs != nil && r.imageFsCap != nil {
		img := r.imageFsCap.fsStats(time.Unix(0, r.imageFs.Timestamp))
		img.UsedBytes, img.InodesUsed = value(r.imageFs.UsedBytes), value(r.imageFs.InodesUsed)
		// containerd keeps the containers' writable layers in the
		// snapshotter beside the images: one filesystem for both.
		n.Runtime = &statsv1alpha1.RuntimeStats{ImageFs: img, ContainerFs: img}
	}
	return n, nil
}

// nodeCPU is the time the CPUs spent on anything but idling and waiting
// for I/O (guest time is counted in user time already).
func (p *Provider) nodeCPU(c procfs.CPUStat, now time.Time) *statsv1alpha1.CPUStats {
	busy := c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
	usage := uint64(busy * 1e9)
	return &statsv1alpha1.CPUStats{
		Time:                 metav1.NewTime(now),
		UsageCoreNanoSeconds: &usage,
		UsageNanoCores:       p.rates.rate(nodeKey, now.UnixNano(), usage),
	}
}

// nodeMemory counts as the kubelet does for the root cgroup: the working
// set is what is used less the inactive page cache, which the kernel can
// drop; available is the rest of the capacity.
func nodeMemory(mi procfs.Meminfo, now time.Time) (*statsv1alpha1.MemoryStats, error) {
	if mi.MemTotalBytes == nil || mi.MemFreeBytes == nil || mi.InactiveFileBytes == nil || mi.AnonPagesBytes == nil {
		return nil, fmt.Errorf("node memory: /proc/meminfo lacks MemTotal, MemFree, Inactive(file) or AnonPages")
	}
	total := *mi.MemTotalBytes
	usage := total - *mi.MemFreeBytes
	ws := usage - min(usage, *mi.InactiveFileBytes)
	avail, rss := total-ws, *mi.AnonPagesBytes
	return &statsv1alpha1.MemoryStats{Time: metav1.NewTime(now), UsageBytes: &usage, WorkingSetBytes: &ws,
		AvailableBytes: &avail, RSSBytes: &rss}, nil
}

// nodeNetwork lists the host's interfaces; the interface of the default
// route is the node's own.
func nodeNetwork(proc procfs.FS, now time.Time) (*statsv1alpha1.NetworkStats, error) {
	dev, err := proc.NetDev()
	if err != nil {
		return nil, fmt.Errorf("node network: %w", err)
	}
	routes, err := proc.NetRoute()
	if err != nil {
		return nil, fmt.Errorf("node network: %w", err)
	}
	var def string
	for _, r := range routes {
		if r.Destination == 0 && r.Mask == 0 {
			def = r.Iface
			break
		}
	}
	return interfaces(dev, now, def), nil
}
