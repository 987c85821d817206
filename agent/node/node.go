package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cairn-os/cairn/agent/node/host"
)

// maxPods is the node's pod capacity, the kubelet's usual.
const maxPods = 110

// The system reservation: what allocatable holds back from capacity for
// init, containerd, cairn-agent and the kernel, so that pods cannot starve
// them.
//   - cpu: 100m.
//   - memory: 256 MiB, plus the memory.available threshold (100 MiB by
//     default), so that pods using all they are allocated do not put the
//     node under pressure.
//   - ephemeral-storage: the nodefs.available threshold, 10 % of the
//     filesystem by default, for the same reason.
const (
	reservedMilliCPU = 100
	// ReservedMemory is also what the pods' cgroup leaves out of the
	// node's memory (agent/kubelet).
	ReservedMemory = 256 << 20
)

// controllerManagedAttachDetach is the annotation by which a node leaves
// attaching and detaching its volumes to the attach/detach controller.
const controllerManagedAttachDetach = "volumes.kubernetes.io/controller-managed-attach-detach"

// register creates the Node, or adopts the Node of the same name that a
// previous run (or the machine's previous life) left: it then brings the
// labels that the node sets up to date, and leaves everything else to the
// status updates. Taints count only when the Node is created: afterwards
// only the control plane may change them.
func (j *joiner) register(ctx context.Context) (*corev1.Node, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	nodes := j.client.CoreV1().Nodes()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: j.cfg.NodeName, Labels: j.labels(), Annotations: map[string]string{
			// The attach/detach controller attaches the volumes of the
			// node's pods, as for the kubelet's default.
			controllerManagedAttachDetach: "true",
		}},
		Status: j.nodeStatus(ctx, nil, metav1.Now()),
	}
	for _, t := range j.cfg.Cluster.NodeTaints {
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: t.Key, Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
	}
	if cidr := j.cfg.Cluster.PodCIDR; cidr != "" {
		node.Spec.PodCIDR, node.Spec.PodCIDRs = cidr, []string{cidr}
	}
	created, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if err == nil {
		j.log.Info("registered the Node", "uid", created.UID)
		j.logConditions(nil, created.Status.Conditions)
		return created, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create Node: %w", err)
	}

	existing, err := nodes.Get(ctx, j.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get Node: %w", err)
	}
	for _, t := range node.Spec.Taints {
		if !slices.ContainsFunc(existing.Spec.Taints, func(e corev1.Taint) bool { return e.MatchTaint(&t) }) {
			j.log.Warn("the existing Node lacks a configured taint; only the control plane can add it", "taint", t.ToString())
		}
	}
	changed := map[string]string{}
	for key, v := range node.Labels {
		if existing.Labels[key] != v {
			changed[key] = v
		}
	}
	annotate := existing.Annotations[controllerManagedAttachDetach] != "true"
	if len(changed) > 0 || annotate {
		meta := map[string]any{"labels": changed}
		if annotate {
			meta["annotations"] = node.Annotations
		}
		patch, err := json.Marshal(map[string]any{"metadata": meta})
		if err != nil {
			return nil, err
		}
		if existing, err = nodes.Patch(ctx, j.cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return nil, fmt.Errorf("update the labels of the Node: %w", err)
		}
	}
	j.log.Info("adopted the existing Node", "uid", existing.UID, "labels updated", slices.Sorted(maps.Keys(changed)))
	return existing, nil
}

// labels returns the labels the node sets on its Node: the configured
// ones, and its hostname, OS and architecture.
func (j *joiner) labels() map[string]string {
	l := maps.Clone(j.cfg.Cluster.NodeLabels)
	if l == nil {
		l = map[string]string{}
	}
	l[corev1.LabelHostname] = j.cfg.NodeName
	l[corev1.LabelOSStable] = runtime.GOOS
	l[corev1.LabelArchStable] = runtime.GOARCH
	return l
}

// hostInfo is what the Node reports of the machine that does not change
// while the agent runs.
type hostInfo struct {
	kernelVersion, osImage, machineID, bootID string
}

// readHostInfo reads hostInfo, logging what it cannot read: the Node then
// reports it empty. Without /etc/machine-id, the machine ID is derived
// from the node name, which is unique in the cluster and stable.
func readHostInfo(nodeName string, log *slog.Logger) hostInfo {
	read := func(what string, f func() (string, error)) string {
		s, err := f()
		if err != nil {
			log.Warn("cannot read the "+what+"; the Node reports none", "err", err)
		}
		return s
	}
	h := hostInfo{
		kernelVersion: read("kernel version", host.KernelVersion),
		osImage:       read("OS image", host.OSImage),
		bootID:        read("boot ID", host.BootID),
	}
	var err error
	if h.machineID, err = host.MachineID(); err != nil {
		h.machineID = derivedMachineID(nodeName)
	}
	return h
}

// derivedMachineID is the machine ID of a node without /etc/machine-id:
// 32 hex digits, as machine-id(5) has them, hashed from the node name.
func derivedMachineID(nodeName string) string {
	sum := sha256.Sum256([]byte("cairn machine id\x00" + nodeName))
	return hex.EncodeToString(sum[:16])
}

// nodeInfo returns the Node's system info.
func (j *joiner) nodeInfo(ctx context.Context) corev1.NodeSystemInfo {
	runtimeVersion, err := j.cfg.RuntimeInfo.RuntimeVersion(ctx)
	if err != nil {
		runtimeVersion = "" // the Ready condition says why
	}
	return corev1.NodeSystemInfo{
		MachineID:               j.host.machineID,
		BootID:                  j.host.bootID,
		KernelVersion:           j.host.kernelVersion,
		OSImage:                 j.host.osImage,
		ContainerRuntimeVersion: runtimeVersion,
		KubeletVersion:          kubeletVersion(j.cfg.Version),
		OperatingSystem:         runtime.GOOS,
		Architecture:            runtime.GOARCH,
	}
}

// kubeletVersion is the kubelet version the Node reports: the Kubernetes
// version with Cairn's as build metadata, "v1.37.2+cairn.0.1.0", which
// ranks as v1.37.2 where the control plane compares versions.
func kubeletVersion(cairnVersion string) string {
	return KubernetesVersion + "+cairn." + cairnVersion
}

// capacity returns the node's resources: cpus, the memory, and the size of
// the filesystem of the node's state; what could not be measured is left
// out.
func capacity(cpus int, mem *host.Memory, disk *host.Filesystem) corev1.ResourceList {
	c := corev1.ResourceList{
		corev1.ResourceCPU:  *resource.NewQuantity(int64(cpus), resource.DecimalSI),
		corev1.ResourcePods: *resource.NewQuantity(maxPods, resource.DecimalSI),
	}
	if mem != nil {
		c[corev1.ResourceMemory] = *resource.NewQuantity(int64(mem.Total), resource.BinarySI)
	}
	if disk != nil {
		c[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(disk.Size), resource.BinarySI)
	}
	return c
}

// allocatable returns capacity less the system reservation and the
// eviction thresholds t, never below 0.
func allocatable(capacity corev1.ResourceList, t Thresholds) corev1.ResourceList {
	a := corev1.ResourceList{}
	for name, q := range capacity {
		switch name {
		case corev1.ResourceCPU:
			a[name] = *resource.NewMilliQuantity(max(q.MilliValue()-reservedMilliCPU, 0), resource.DecimalSI)
		case corev1.ResourceMemory:
			a[name] = *resource.NewQuantity(max(q.Value()-ReservedMemory-int64(t.MemoryAvailable), 0), resource.BinarySI)
		case corev1.ResourceEphemeralStorage:
			a[name] = *resource.NewQuantity(q.Value()-q.Value()*int64(t.NodefsAvailable)/100, resource.BinarySI)
		default:
			a[name] = q
		}
	}
	return a
}
