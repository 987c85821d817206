package pods

import (
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/cairn-os/cairn/agent/node/host"
)

// QOSClass is pod's quality of service class: the API server's, which it
// sets on every Pod it admits, or worked out as it does for a static pod.
func QOSClass(pod *corev1.Pod) corev1.PodQOSClass {
	if q := pod.Status.QOSClass; q != "" {
		return q
	}
	requests, limits := corev1.ResourceList{}, corev1.ResourceList{}
	guaranteed := true
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, hasReq := c.Resources.Requests[r]
			lim, hasLim := c.Resources.Limits[r]
			if hasReq && !req.IsZero() {
				requests[r] = req
			}
			if hasLim && !lim.IsZero() {
				limits[r] = lim
			}
			// A request the API server defaults from the limit is
			// equal to it.
			if !hasLim || hasReq && req.Cmp(lim) != 0 {
				guaranteed = false
			}
		}
	}
	switch {
	case len(requests) == 0 && len(limits) == 0:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

// The kubelet's out-of-memory scores: the node's own services are at
// -999 (init sets theirs), Guaranteed and critical pods just above.
const (
	guaranteedOOMScoreAdj = -997
	bestEffortOOMScoreAdj = 1000
)

// oomScoreAdj is the oom_score_adj of container c of pod, as the kubelet
// computes it: Guaranteed and critical pods -997, BestEffort 1000, a
// Burstable container the lower the more memory it requests of the
// node's capacity, between 2 and 999.
func oomScoreAdj(pod *corev1.Pod, c *corev1.Container) int64 {
	if IsCritical(pod) {
		return guaranteedOOMScoreAdj
	}
	switch QOSClass(pod) {
	case corev1.PodQOSGuaranteed:
		return guaranteedOOMScoreAdj
	case corev1.PodQOSBestEffort:
		return bestEffortOOMScoreAdj
	}
	capacity := memoryCapacity()
	if capacity <= 0 {
		return 999
	}
	req := c.Resources.Requests.Memory().Value()
	return min(max(1000-1000*req/capacity, 2), 999)
}

// systemCriticalPriority is the priority of the system-cluster-critical
// class, the lowest of the critical ones (k8s.io/kubernetes'
// scheduling.SystemCriticalPriority).
const systemCriticalPriority = 2_000_000_000

// IsCritical says whether pod is critical to the node, as the kubelet
// tells: a priority of system-cluster-critical or more. Its containers
// are the last the OOM killer picks, the node's shutdown ends it last,
// and eviction leaves it alone.
func IsCritical(pod *corev1.Pod) bool {
	return pod.Spec.Priority != nil && *pod.Spec.Priority >= systemCriticalPriority
}

// memoryCapacity is the node's memory, read once.
var memoryCapacity = sync.OnceValue(func() int64 {
	m, err := host.ReadMemory()
	if err != nil {
		return 0
	}
	return int64(m.Total)
})
