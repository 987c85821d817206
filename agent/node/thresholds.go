package node

import (
	"cmp"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cairn-os/cairn/agent/node/host"
)

// Thresholds are the node's hard eviction thresholds, the kubelet's
// evictionHard: below one of them the node reports the pressure in its
// conditions and evicts pods (agent/kubelet). Zero fields take
// DefaultThresholds'.
type Thresholds struct {
	// MemoryAvailable is memory.available, in bytes of MemAvailable.
	MemoryAvailable uint64
	// NodefsAvailable and NodefsInodesFree are the percent of the
	// kubelet directory's filesystem free, of its space and its inodes;
	// ImagefsAvailable that of containerd's images' filesystem;
	// PIDAvailable the percent of kernel.pid_max left.
	NodefsAvailable, NodefsInodesFree, ImagefsAvailable, PIDAvailable uint64
}

// DefaultThresholds are the kubelet's default hard eviction thresholds,
// and a process ID threshold of its own.
var DefaultThresholds = Thresholds{MemoryAvailable: 100 << 20, NodefsAvailable: 10, NodefsInodesFree: 5, ImagefsAvailable: 15, PIDAvailable: 10}

// WithDefaults is t with its zero fields set to DefaultThresholds'.
func (t Thresholds) WithDefaults() Thresholds {
	d := DefaultThresholds
	return Thresholds{
		MemoryAvailable: cmp.Or(t.MemoryAvailable, d.MemoryAvailable), NodefsAvailable: cmp.Or(t.NodefsAvailable, d.NodefsAvailable),
		NodefsInodesFree: cmp.Or(t.NodefsInodesFree, d.NodefsInodesFree), ImagefsAvailable: cmp.Or(t.ImagefsAvailable, d.ImagefsAvailable),
		PIDAvailable: cmp.Or(t.PIDAvailable, d.PIDAvailable),
	}
}

// Signal is a threshold crossed, in the kubelet's words.
type Signal struct {
	// Name is the eviction signal's, e.g. memory.available.
	Name string
	// Condition is the Node condition it sets.
	Condition corev1.NodeConditionType
	// Resource is what the node lacks: memory, ephemeral-storage, pids.
	Resource corev1.ResourceName
	// Threshold and Available are the threshold and what is left.
	Threshold, Available resource.Quantity
	// Message says so in the condition: the threshold, not the
	// measurement, for it to change only with the status.
	Message string
}

// Memory is the memory.available signal if m crosses its threshold.
func (t Thresholds) Memory(m host.Memory) *Signal {
	if m.Available >= t.MemoryAvailable {
		return nil
	}
	return &Signal{Name: "memory.available", Condition: corev1.NodeMemoryPressure, Resource: corev1.ResourceMemory,
		Threshold: bytes(t.MemoryAvailable), Available: bytes(m.Available),
		Message: fmt.Sprintf("available memory is below %d MiB", t.MemoryAvailable>>20)}
}

// Nodefs is the nodefs.available or nodefs.inodesFree signal if the
// kubelet directory's filesystem fs crosses its threshold.
func (t Thresholds) Nodefs(fs host.Filesystem) *Signal {
	switch {
	case fs.Free < fs.Size/100*t.NodefsAvailable:
		return &Signal{Name: "nodefs.available", Condition: corev1.NodeDiskPressure, Resource: corev1.ResourceEphemeralStorage,
			Threshold: bytes(fs.Size / 100 * t.NodefsAvailable), Available: bytes(fs.Free),
			Message: fmt.Sprintf("free space of the node's filesystem is below %d %%", t.NodefsAvailable)}
	case fs.Inodes > 0 && fs.InodesFree < fs.Inodes/100*t.NodefsInodesFree:
		return &Signal{Name: "nodefs.inodesFree", Condition: corev1.NodeDiskPressure, Resource: corev1.ResourceEphemeralStorage,
			Threshold: count(fs.Inodes / 100 * t.NodefsInodesFree), Available: count(fs.InodesFree),
			Message: fmt.Sprintf("free inodes of the node's filesystem are below %d %%", t.NodefsInodesFree)}
	}
	return nil
}

// Imagefs is the imagefs.available signal if the images' filesystem fs
// crosses its threshold.
func (t Thresholds) Imagefs(fs host.Filesystem) *Signal {
	if fs.Free >= fs.Size/100*t.ImagefsAvailable {
		return nil
	}
	return &Signal{Name: "imagefs.available", Condition: corev1.NodeDiskPressure, Resource: corev1.ResourceEphemeralStorage,
		Threshold: bytes(fs.Size / 100 * t.ImagefsAvailable), Available: bytes(fs.Free),
		Message: fmt.Sprintf("free space of the images' filesystem is below %d %%", t.ImagefsAvailable)}
}

// PIDs is the pid.available signal if p crosses its threshold.
func (t Thresholds) PIDs(p host.PIDs) *Signal {
	left := p.Max - min(p.Used, p.Max)
	if left >= p.Max/100*t.PIDAvailable {
		return nil
	}
	return &Signal{Name: "pid.available", Condition: corev1.NodePIDPressure, Resource: "pids",
		Threshold: count(p.Max / 100 * t.PIDAvailable), Available: count(left),
		Message: fmt.Sprintf("process IDs left are below %d %% of kernel.pid_max", t.PIDAvailable)}
}

func bytes(n uint64) resource.Quantity { return *resource.NewQuantity(int64(n), resource.BinarySI) }
func count(n uint64) resource.Quantity { return *resource.NewQuantity(int64(n), resource.DecimalSI) }
