// Package stats reads the node's resource usage in the kubelet's Summary
// format (k8s.io/kubelet's stats/v1alpha1), the one source of the kubelet
// server's /stats/summary and /metrics/resource: the containers' CPU,
// memory and filesystems from the CRI (ListContainerStats, ImageFsInfo);
// the pods' from ListPodSandboxStats, or, where the runtime has no cgroup
// of the pod, as their containers' sums, with their network read in their
// network namespace; the node's from the host (/proc, statfs). CPU rates
// (usageNanoCores) come from the previous reading of the same container,
// pod or node, as the kubelet's.
//
//	p := stats.New(stats.Config{NodeName: name, Runtime: c.Runtime, Images: c.Images, RootDir: dir, PodLogRoot: logs})
//	s, err := p.Summary(ctx, false)
package stats

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/cairn-os/cairn/internal/crilog"
)

// Config is what a Provider reads.
type Config struct {
	// NodeName names the node in the Summary.
	NodeName string
	// Runtime and Images are the CRI's services.
	Runtime criv1.RuntimeServiceClient
	Images  criv1.ImageServiceClient
	// RootDir is on the node's filesystem (the kubelet's directory).
	RootDir string
	// PodLogRoot holds the containers' logs (internal/crilog's layout).
	PodLogRoot string
	// VolumeStats, if set, tells a pod's volumes' use, by the pod's UID:
	// the CSI drivers' (agent/csi.Plugins).
	VolumeStats func(ctx context.Context, uid types.UID) []statsv1alpha1.VolumeStats
	// Log receives what is worth knowing but not failing for; nil means
	// slog.Default().
	Log *slog.Logger
}

// Provider reads Summaries. Its methods may be called from many
// goroutines.
type Provider struct {
	cfg   Config
	rates cpuRates
}

// New returns a Provider of cfg.
func New(cfg Config) *Provider {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Provider{cfg: cfg}
}

// The keys of the CPU rates: the node, and pods and containers by their
// runtime IDs.
const nodeKey = "node"

func podKey(id string) string       { return "pod/" + id }
func containerKey(id string) string { return "container/" + id }

// Summary reads the node's, its running pods' and their running
// containers' usage; onlyCPUAndMemory leaves out filesystems and
// networks (the kubelet's only_cpu_and_memory). It fails if the runtime
// does not answer.
func (p *Provider) Summary(ctx context.Context, onlyCPUAndMemory bool) (*statsv1alpha1.Summary, error) {
	r, err := p.read(ctx, onlyCPUAndMemory)
	if err != nil {
		return nil, err
	}
	node, err := p.nodeStats(r, onlyCPUAndMemory)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{nodeKey: true}
	pods := make([]statsv1alpha1.PodStats, 0, len(r.sandboxes))
	for _, sb := range r.sandboxes {
		seen[podKey(sb.Id)] = true
		ps := p.podStats(ctx, sb, r, onlyCPUAndMemory)
		for _, c := range r.containers[sb.Id] {
			seen[containerKey(c.Id)] = true
		}
		pods = append(pods, ps)
	}
	p.rates.keep(seen)
	return &statsv1alpha1.Summary{Node: node, Pods: pods}, nil
}

// reading is one reading of the runtime and the filesystems under it.
type reading struct {
	sandboxes  []*criv1.PodSandbox
	containers map[string][]*criv1.Container // by sandbox ID
	cstats     map[string]*criv1.ContainerStats
	pstats     map[string]*criv1.PodSandboxStats
	// Nil with onlyCPUAndMemory:
	imageFs    *criv1.FilesystemUsage
	imageFsCap *fsCapacity
	nodeFsCap  *fsCapacity
	logFsCap   *fsCapacity // nil also before the first pod
}

func (p *Provider) read(ctx context.Context, onlyCPUAndMemory bool) (*reading, error) {
	st := &reading{containers: map[string][]*criv1.Container{}, cstats: map[string]*criv1.ContainerStats{},
		pstats: map[string]*criv1.PodSandboxStats{}}
	sbs, err := p.cfg.Runtime.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{Filter: &criv1.PodSandboxFilter{
		State: &criv1.PodSandboxStateValue{State: criv1.PodSandboxState_SANDBOX_READY}}})
	if err != nil {
		return nil, fmt.Errorf("CRI ListPodSandbox: %w", err)
	}
	st.sandboxes = sbs.Items
	cs, err := p.cfg.Runtime.ListContainers(ctx, &criv1.ListContainersRequest{Filter: &criv1.ContainerFilter{
		State: &criv1.ContainerStateValue{State: criv1.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return nil, fmt.Errorf("CRI ListContainers: %w", err)
	}
	for _, c := range cs.Containers {
		st.containers[c.PodSandboxId] = append(st.containers[c.PodSandboxId], c)
	}
	css, err := p.cfg.Runtime.ListContainerStats(ctx, &criv1.ListContainerStatsRequest{})
	if err != nil {
		return nil, fmt.Errorf("CRI ListContainerStats: %w", err)
	}
	for _, s := range css.Stats {
		st.cstats[s.GetAttributes().GetId()] = s
	}
	// containerd reads a pod's own stats from the pod's cgroup, which it
	// knows only from the sandbox's cgroup parent; without one (Cairn's
	// pods have none yet) it fails the whole call. The pods then count
	// from their containers and their network namespaces.
	pss, err := p.cfg.Runtime.ListPodSandboxStats(ctx, &criv1.ListPodSandboxStatsRequest{})
	if err != nil {
		p.cfg.Log.Debug("stats: no pod stats from the runtime, the pods count from their containers", "err", err)
	}
	for _, s := range pss.GetStats() {
		st.pstats[s.GetAttributes().GetId()] = s
	}
	if onlyCPUAndMemory {
		return st, nil
	}
	c, err := statfs(p.cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("node filesystem: %w", err)
	}
	st.nodeFsCap = &c
	// The log root comes with the first pod.
	if c, err := statfs(p.cfg.PodLogRoot); err == nil {
		st.logFsCap = &c
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("log filesystem: %w", err)
	}
	fsi, err := p.cfg.Images.ImageFsInfo(ctx, &criv1.ImageFsInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("CRI ImageFsInfo: %w", err)
	}
	if len(fsi.ImageFilesystems) > 0 {
		st.imageFs = fsi.ImageFilesystems[0]
		c, err := statfs(st.imageFs.GetFsId().GetMountpoint())
		if err != nil {
			return nil, fmt.Errorf("image filesystem: %w", err)
		}
		st.imageFsCap = &c
	}
	return st, nil
}

func (p *Provider) podStats(ctx context.Context, sb *criv1.PodSandbox, r *reading, onlyCPUAndMemory bool) statsv1alpha1.PodStats {
	md := sb.GetMetadata()
	ps := statsv1alpha1.PodStats{
		PodRef:     statsv1alpha1.PodReference{Name: md.GetName(), Namespace: md.GetNamespace(), UID: md.GetUid()},
		StartTime:  metav1.NewTime(time.Unix(0, sb.CreatedAt)),
		Containers: []statsv1alpha1.ContainerStats{},
	}
	linux := r.pstats[sb.Id].GetLinux()
	ps.CPU = p.cpu(podKey(sb.Id), linux.GetCpu())
	ps.Memory = memory(linux.GetMemory())
	if !onlyCPUAndMemory {
		ps.Network = network(linux.GetNetwork())
		if ps.Network == nil {
			ps.Network = p.sandboxNetwork(ctx, sb.Id)
		}
	}
	// The pod's ephemeral storage is on the node's filesystem: its
	// containers' writable layers and logs (volumes are not counted yet).
	var ephemeral *statsv1alpha1.FsStats
	if !onlyCPUAndMemory && r.nodeFsCap != nil {
		ephemeral = r.nodeFsCap.fsStats(time.Now())
		var used, inodes uint64
		ephemeral.UsedBytes, ephemeral.InodesUsed = &used, &inodes
	}
	for _, c := range r.containers[sb.Id] {
		s := r.cstats[c.Id]
		cs := statsv1alpha1.ContainerStats{
			Name:      c.GetMetadata().GetName(),
			StartTime: metav1.NewTime(time.Unix(0, c.CreatedAt)),
			CPU:       p.cpu(containerKey(c.Id), s.GetCpu()),
			Memory:    memory(s.GetMemory()),
		}
		if !onlyCPUAndMemory {
			cs.Rootfs = rootfs(s.GetWritableLayer(), r.imageFsCap)
			cs.Logs = p.logs(ps.PodRef, cs.Name, r.logFsCap)
			if ephemeral != nil {
				addFs(ephemeral, cs.Rootfs)
				addFs(ephemeral, cs.Logs)
			}
		}
		ps.Containers = append(ps.Containers, cs)
	}
	ps.EphemeralStorage = ephemeral
	if !onlyCPUAndMemory && p.cfg.VolumeStats != nil {
		ps.VolumeStats = p.cfg.VolumeStats(ctx, types.UID(md.GetUid()))
	}
	if ps.CPU == nil && ps.Memory == nil {
		ps.CPU, ps.Memory = sumContainers(ps.Containers)
	}
	return ps
}

// sumContainers is a pod's CPU and memory as its containers' sums, as the
// kubelet counts a pod it has no cgroup stats of: the rate too is the
// sum of the containers' rates, so that a container restarted does not
// make the pod's usage go back.
func sumContainers(cs []statsv1alpha1.ContainerStats) (*statsv1alpha1.CPUStats, *statsv1alpha1.MemoryStats) {
	var cpu *statsv1alpha1.CPUStats
	var mem *statsv1alpha1.MemoryStats
	add := func(sum **uint64, v *uint64) {
		if v == nil {
			return
		}
		if *sum == nil {
			*sum = new(uint64)
		}
		**sum += *v
	}
	later := func(t *metav1.Time, u metav1.Time) {
		if t.Before(&u) {
			*t = u
		}
	}
	for _, c := range cs {
		if c.CPU != nil {
			if cpu == nil {
				cpu = &statsv1alpha1.CPUStats{}
			}
			later(&cpu.Time, c.CPU.Time)
			add(&cpu.UsageCoreNanoSeconds, c.CPU.UsageCoreNanoSeconds)
			add(&cpu.UsageNanoCores, c.CPU.UsageNanoCores)
		}
		if c.Memory != nil {
			if mem == nil {
				mem = &statsv1alpha1.MemoryStats{}
			}
			later(&mem.Time, c.Memory.Time)
			add(&mem.UsageBytes, c.Memory.UsageBytes)
			add(&mem.WorkingSetBytes, c.Memory.WorkingSetBytes)
			add(&mem.RSSBytes, c.Memory.RSSBytes)
			add(&mem.PageFaults, c.Memory.PageFaults)
			add(&mem.MajorPageFaults, c.Memory.MajorPageFaults)
		}
	}
	return cpu, mem
}

// cpu converts a CRI CPU reading, with its rate since the key's previous
// one.
func (p *Provider) cpu(key string, u *criv1.CpuUsage) *statsv1alpha1.CPUStats {
	if u == nil || u.UsageCoreNanoSeconds == nil {
		return nil
	}
	usage := u.UsageCoreNanoSeconds.Value
	return &statsv1alpha1.CPUStats{
		Time:                 metav1.NewTime(time.Unix(0, u.Timestamp)),
		UsageCoreNanoSeconds: &usage,
		UsageNanoCores:       p.rates.rate(key, u.Timestamp, usage),
	}
}

func memory(m *criv1.MemoryUsage) *statsv1alpha1.MemoryStats {
	if m == nil {
		return nil
	}
	return &statsv1alpha1.MemoryStats{
		Time:            metav1.NewTime(time.Unix(0, m.Timestamp)),
		AvailableBytes:  value(m.AvailableBytes),
		UsageBytes:      value(m.UsageBytes),
		WorkingSetBytes: value(m.WorkingSetBytes),
		RSSBytes:        value(m.RssBytes),
		PageFaults:      value(m.PageFaults),
		MajorPageFaults: value(m.MajorPageFaults),
	}
}

func network(n *criv1.NetworkUsage) *statsv1alpha1.NetworkStats {
	if n == nil {
		return nil
	}
	s := &statsv1alpha1.NetworkStats{Time: metav1.NewTime(time.Unix(0, n.Timestamp))}
	if d := n.DefaultInterface; d != nil {
		s.InterfaceStats = iface(d)
	}
	for _, i := range n.Interfaces {
		s.Interfaces = append(s.Interfaces, iface(i))
	}
	return s
}

func iface(i *criv1.NetworkInterfaceUsage) statsv1alpha1.InterfaceStats {
	return statsv1alpha1.InterfaceStats{Name: i.Name, RxBytes: value(i.RxBytes), RxErrors: value(i.RxErrors),
		TxBytes: value(i.TxBytes), TxErrors: value(i.TxErrors)}
}

// rootfs is a container's writable layer, on the image filesystem.
func rootfs(u *criv1.FilesystemUsage, onFs *fsCapacity) *statsv1alpha1.FsStats {
	if u == nil {
		return nil
	}
	t := time.Unix(0, u.Timestamp)
	s := &statsv1alpha1.FsStats{Time: metav1.NewTime(t)}
	if onFs != nil {
		s = onFs.fsStats(t)
	}
	s.UsedBytes, s.InodesUsed = value(u.UsedBytes), value(u.InodesUsed)
	return s
}

// logs is the usage of a container's log directory, on the log root's
// filesystem onFs; nil if it cannot be read.
func (p *Provider) logs(pod statsv1alpha1.PodReference, container string, onFs *fsCapacity) *statsv1alpha1.FsStats {
	dir := filepath.Join(crilog.PodDir(p.cfg.PodLogRoot, pod.Namespace, pod.Name, pod.UID), container)
	var used, inodes uint64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		if info, err := d.Info(); err == nil && !d.IsDir() {
			used += uint64(info.Size())
		}
		return nil
	})
	if err != nil || onFs == nil {
		return nil
	}
	s := onFs.fsStats(time.Now())
	s.UsedBytes, s.InodesUsed = &used, &inodes
	return s
}

// addFs adds b's usage to sum's.
func addFs(sum *statsv1alpha1.FsStats, b *statsv1alpha1.FsStats) {
	if b == nil {
		return
	}
	if b.UsedBytes != nil {
		*sum.UsedBytes += *b.UsedBytes
	}
	if b.InodesUsed != nil {
		*sum.InodesUsed += *b.InodesUsed
	}
}

func value(v *criv1.UInt64Value) *uint64 {
	if v == nil {
		return nil
	}
	x := v.Value
	return &x
}
