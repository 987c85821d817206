package pods

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/internal/crilog"
)

// CPU share and quota arithmetic, the kernel's and the kubelet's: 1024
// shares per CPU, at least 2; quota per 100 ms period, at least 1 ms.
const (
	sharesPerCPU = 1024
	minShares    = 2
	cfsPeriod    = 100000 // µs
	minQuota     = 1000   // µs
)

// containerParams is what a container's config takes beyond the pod's
// spec, worked out when it is made.
type containerParams struct {
	attempt uint32            // the attempt-th container of its name in the sandbox
	image   string            // the reference the runtime resolved
	env     []*criv1.KeyValue // the environment, references resolved (containerEnv)
	mounts  []*criv1.Mount    // the pod's volumes c mounts (mounts)
	devices []*criv1.Device   // the pod's block volumes c maps (mounts)
	// pidTarget, if set, is the runtime's ID of the container whose
	// process namespace an ephemeral container shares.
	pidTarget string
}

// containerConfig is the CRI container for c; its command and args have
// the $(VAR) references to its environment expanded.
func containerConfig(pod *corev1.Pod, c *corev1.Container, p containerParams) *criv1.ContainerConfig {
	return &criv1.ContainerConfig{
		Metadata:   &criv1.ContainerMetadata{Name: c.Name, Attempt: p.attempt},
		Image:      &criv1.ImageSpec{Image: p.image, UserSpecifiedImage: c.Image},
		Command:    expandAll(c.Command, p.env),
		Args:       expandAll(c.Args, p.env),
		WorkingDir: c.WorkingDir,
		Envs:       p.env,
		Mounts:     p.mounts,
		Devices:    p.devices,
		Labels: map[string]string{
			LabelPodName:       pod.Name,
			LabelPodNamespace:  pod.Namespace,
			LabelPodUID:        string(pod.UID),
			LabelContainerName: c.Name,
		},
		Annotations: containerAnnotations(c),
		LogPath:     crilog.ContainerLog(c.Name, p.attempt),
		Stdin:       c.Stdin,
		Tty:         c.TTY,
		Linux: &criv1.LinuxContainerConfig{
			Resources:       containerResources(pod, c),
			SecurityContext: securityContext(pod, c, p.pidTarget),
		},
	}
}

// containerAnnotations are those of c's CRI container: its termination
// message file and the resources it is created with.
func containerAnnotations(c *corev1.Container) map[string]string {
	out := messageAnnotations(c)
	if out == nil {
		out = map[string]string{}
	}
	out[annotationResources] = resourcesAnnotation(c.Resources)
	return out
}

// containerResources are c's cgroup settings and its out-of-memory score.
func containerResources(pod *corev1.Pod, c *corev1.Container) *criv1.LinuxContainerResources {
	r := resources(c.Resources)
	r.OomScoreAdj = oomScoreAdj(pod, c)
	return r
}

// resources turns requests and limits into cgroup settings: CPU requests
// into shares, CPU limits into a CFS quota, the memory limit into a memory
// limit. A CPU limit without a request gets shares for the limit, as the
// API server defaults the request to the limit.
func resources(r corev1.ResourceRequirements) *criv1.LinuxContainerResources {
	out := &criv1.LinuxContainerResources{}
	cpuReq, hasReq := r.Requests[corev1.ResourceCPU]
	cpuLim, hasLim := r.Limits[corev1.ResourceCPU]
	switch {
	case hasReq:
		out.CpuShares = max(cpuReq.MilliValue()*sharesPerCPU/1000, minShares)
	case hasLim:
		out.CpuShares = max(cpuLim.MilliValue()*sharesPerCPU/1000, minShares)
	default:
		out.CpuShares = minShares
	}
	if hasLim {
		out.CpuPeriod = cfsPeriod
		out.CpuQuota = max(cpuLim.MilliValue()*cfsPeriod/1000, minQuota)
	}
	if mem, ok := r.Limits[corev1.ResourceMemory]; ok {
		out.MemoryLimitInBytes = mem.Value()
	}
	return out
}

// securityContext is the container's, falling back to the pod's for the
// user and group; pidTarget, if set, is the container whose process
// namespace it shares.
func securityContext(pod *corev1.Pod, c *corev1.Container, pidTarget string) *criv1.LinuxContainerSecurityContext {
	out := &criv1.LinuxContainerSecurityContext{
		NamespaceOptions: &criv1.NamespaceOption{Network: criv1.NamespaceMode_POD, Pid: criv1.NamespaceMode_CONTAINER, Ipc: criv1.NamespaceMode_POD},
	}
	if pod.Spec.HostNetwork {
		out.NamespaceOptions.Network = criv1.NamespaceMode_NODE
	}
	if pod.Spec.HostPID {
		out.NamespaceOptions.Pid = criv1.NamespaceMode_NODE
	} else if pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace {
		out.NamespaceOptions.Pid = criv1.NamespaceMode_POD
	}
	if pidTarget != "" && out.NamespaceOptions.Pid == criv1.NamespaceMode_CONTAINER {
		out.NamespaceOptions.Pid, out.NamespaceOptions.TargetId = criv1.NamespaceMode_TARGET, pidTarget
	}
	if pod.Spec.HostIPC {
		out.NamespaceOptions.Ipc = criv1.NamespaceMode_NODE
	}
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			out.RunAsUser = &criv1.Int64Value{Value: *psc.RunAsUser}
		}
		if psc.RunAsGroup != nil {
			out.RunAsGroup = &criv1.Int64Value{Value: *psc.RunAsGroup}
		}
		out.SupplementalGroups = psc.SupplementalGroups
	}
	sc := c.SecurityContext
	if sc == nil {
		return out
	}
	if sc.RunAsUser != nil {
		out.RunAsUser = &criv1.Int64Value{Value: *sc.RunAsUser}
	}
	if sc.RunAsGroup != nil {
		out.RunAsGroup = &criv1.Int64Value{Value: *sc.RunAsGroup}
	}
	if sc.Privileged != nil {
		out.Privileged = *sc.Privileged
	}
	if sc.ReadOnlyRootFilesystem != nil {
		out.ReadonlyRootfs = *sc.ReadOnlyRootFilesystem
	}
	if caps := sc.Capabilities; caps != nil {
		out.Capabilities = &criv1.Capability{}
		for _, a := range caps.Add {
			out.Capabilities.AddCapabilities = append(out.Capabilities.AddCapabilities, string(a))
		}
		for _, d := range caps.Drop {
			out.Capabilities.DropCapabilities = append(out.Capabilities.DropCapabilities, string(d))
		}
	}
	if sc.AllowPrivilegeEscalation != nil {
		out.NoNewPrivs = !*sc.AllowPrivilegeEscalation
	}
	return out
}

// ephemeralTarget is the targetContainerName of the ephemeral container
// of pod named name; empty if it names none, or name is no ephemeral
// container.
func ephemeralTarget(pod *corev1.Pod, name string) string {
	for _, ec := range pod.Spec.EphemeralContainers {
		if ec.Name == name {
			return ec.TargetContainerName
		}
	}
	return ""
}

// containerName is how errors name a container of a pod.
func containerName(pod *corev1.Pod, c *corev1.Container) string {
	return fmt.Sprintf("container %s of pod %s/%s", c.Name, pod.Namespace, pod.Name)
}
