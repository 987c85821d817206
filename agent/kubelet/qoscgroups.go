package kubelet

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// qosCgroups lays out the pods' cgroups as the kubelet does with the
// cgroupfs driver: /kubepods, the pods' share of the node (memory.max its
// allocatable, what the node keeps for itself left out), and below it
// /kubepods/burstable and /kubepods/besteffort (the lowest CPU weight); a
// pod's cgroup, pod<UID>, is under its QoS class's (a Guaranteed pod's
// under /kubepods itself), limited to the sum of its containers' limits
// when each has one, its CPU weight that of its CPU requests; the
// Burstable class's CPU weight is that of its pods' requests. The runtime
// puts the pod's sandbox and containers below it.
//
// root is the cgroup v2 mount, /sys/fs/cgroup on a node; empty where
// there is none (a v1 or hybrid host): the runtime is then only given the
// paths, and makes them.
type qosCgroups struct {
	root string
	log  *slog.Logger
	// active, once set, lists the pods the node runs, whose Burstable
	// ones share out the Burstable class's CPU weight.
	active func() []*corev1.Pod

	mu        sync.Mutex
	burstable string // the Burstable class's CPU weight written last
}

// newQOSCgroups finds cgroup v2 at /sys/fs/cgroup, or not.
func newQOSCgroups(log *slog.Logger) *qosCgroups {
	q := &qosCgroups{log: log}
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		q.root = "/sys/fs/cgroup"
	}
	return q
}

// parent is the cgroup of pod, which its sandbox goes under.
func parent(pod *corev1.Pod) string {
	dir := "pod" + string(pod.UID)
	switch pods.QOSClass(pod) {
	case corev1.PodQOSGuaranteed:
		return "/kubepods/" + dir
	case corev1.PodQOSBurstable:
		return "/kubepods/burstable/" + dir
	}
	return "/kubepods/besteffort/" + dir
}

// setup makes /kubepods and the classes' cgroups, /kubepods limited to
// memoryMax bytes (0: no limit).
func (q *qosCgroups) setup(memoryMax int64) error {
	if q.root == "" {
		return nil
	}
	limit := "max"
	if memoryMax > 0 {
		limit = strconv.FormatInt(memoryMax, 10)
	}
	for _, w := range []struct{ dir, file, value string }{
		{"kubepods", "", ""},
		{"kubepods", "cgroup.subtree_control", "+cpu +memory +pids"},
		{"kubepods", "memory.max", limit},
		{"kubepods/burstable", "cgroup.subtree_control", "+cpu +memory +pids"},
		{"kubepods/besteffort", "cgroup.subtree_control", "+cpu +memory +pids"},
		// The kubelet's cpu.shares of 2, in cgroup v2's weights.
		{"kubepods/besteffort", "cpu.weight", "1"},
	} {
		dir := filepath.Join(q.root, w.dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("pods' cgroups: %w", err)
		}
		if w.file == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, w.file), []byte(w.value), 0o644); err != nil {
			return fmt.Errorf("pods' cgroups: write %s to %s: %w", w.value, filepath.Join(dir, w.file), err)
		}
	}
	return nil
}

// cgroupParent makes pod's cgroup, with its pod-level limits, and returns
// its path for the runtime; on a host without cgroup v2, the path alone.
func (q *qosCgroups) cgroupParent(pod *corev1.Pod) string {
	p := parent(pod)
	if q.root == "" {
		return p
	}
	dir := filepath.Join(q.root, p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		q.log.Warn("pod cgroup", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		return p
	}
	if pods.QOSClass(pod) == corev1.PodQOSBurstable && q.active != nil {
		q.weighBurstable(append(q.active(), pod))
	}
	mem, cpu := podLimits(pod)
	for file, v := range map[string]string{"memory.max": mem, "cpu.max": cpu, "cpu.weight": weight(cpuRequest(pod))} {
		if v == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644); err != nil {
			q.log.Warn("pod cgroup limit", "pod", pod.Namespace+"/"+pod.Name, "file", file, "err", err)
		}
	}
	return p
}

// podLimits are pod's memory.max and cpu.max when every container has a
// limit of that resource: the sum of the limits, as the kubelet sets
// them; "" otherwise.
func podLimits(pod *corev1.Pod) (memory, cpu string) {
	var memSum, cpuSum int64
	memAll, cpuAll := len(pod.Spec.Containers) > 0, len(pod.Spec.Containers) > 0
	for _, c := range pod.Spec.Containers {
		if m, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			memSum += m.Value()
		} else {
			memAll = false
		}
		if l, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
			cpuSum += l.MilliValue()
		} else {
			cpuAll = false
		}
	}
	if memAll {
		memory = strconv.FormatInt(memSum, 10)
	}
	if cpuAll {
		// A period of 100 ms, the quota the limit's share of it.
		cpu = fmt.Sprintf("%d 100000", max(cpuSum*100, 1000))
	}
	return memory, cpu
}

// cpuRequest is pod's CPU request in millicores: its containers' (a
// limit without a request counts as the request).
func cpuRequest(pod *corev1.Pod) int64 {
	var milli int64
	for _, c := range pod.Spec.Containers {
		if r, ok := c.Resources.Requests[corev1.ResourceCPU]; ok {
			milli += r.MilliValue()
		} else if l, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
			milli += l.MilliValue()
		}
	}
	return milli
}

// weight is the cgroup v2 CPU weight of a CPU request of milli
// millicores, as the kubelet converts cpu.shares: 1024 shares a CPU, at
// least 2.
func weight(milli int64) string {
	shares := max(milli*1024/1000, 2)
	return strconv.FormatInt(1+(min(shares, 262144)-2)*9999/262142, 10)
}

// weighBurstable gives the Burstable class the CPU weight of the CPU
// requests of the Burstable pods among active, as the kubelet sizes the
// class to its pods; it writes only a weight that changed.
func (q *qosCgroups) weighBurstable(active []*corev1.Pod) {
	if q.root == "" {
		return
	}
	var milli int64
	seen := map[types.UID]bool{}
	for _, p := range active {
		if !seen[p.UID] && pods.QOSClass(p) == corev1.PodQOSBurstable {
			seen[p.UID] = true
			milli += cpuRequest(p)
		}
	}
	w := weight(milli)
	q.mu.Lock()
	defer q.mu.Unlock()
	if w == q.burstable {
		return
	}
	if err := os.WriteFile(filepath.Join(q.root, "kubepods/burstable/cpu.weight"), []byte(w), 0o644); err != nil {
		q.log.Warn("Burstable class CPU weight", "weight", w, "err", err)
		return
	}
	q.burstable = w
}

// remove removes pod's cgroup, whose containers and sandbox are gone:
// the kubelet deletes a Pod's object only once its cgroup is gone too.
func (q *qosCgroups) remove(pod *corev1.Pod) error {
	if q.root == "" {
		return nil
	}
	if err := os.Remove(filepath.Join(q.root, parent(pod))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the pod's cgroup: %w", err)
	}
	return nil
}
