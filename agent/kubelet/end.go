package kubelet

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// evictedReason is the status reason of a pod the node evicted, and
// terminationByKubelet the reason of the DisruptionTarget condition of a
// pod that the node ended, evicted or shut down.
const (
	evictedReason        = "Evicted"
	terminationByKubelet = "TerminationByKubelet"
)

// podEnd is why the node ends a pod for good, stopping its containers
// within grace: its activeDeadlineSeconds passed, the node shuts down, or
// the node evicts it.
type podEnd struct {
	reason, message string
	grace           time.Duration
	// condition, if set, is added to the pod's status: a
	// DisruptionTarget.
	condition *corev1.PodCondition
}

// endOf is how the node ends pod now, if it does: the node's shutdown
// first, else an eviction under pressure, else pod's deadline, else an
// emptyDir past its sizeLimit.
func (s *podSyncer) endOf(pod *corev1.Pod) *podEnd {
	if n := s.shutdown.Load(); n != nil {
		if e := n.endOf(pod); e != nil {
			return e
		}
	}
	if e, ok := s.evicted.Load(pod.UID); ok {
		return e.(*podEnd)
	}
	if pastDeadline(pod, time.Now()) {
		return &podEnd{reason: deadlineReason, message: deadlineMessage, grace: pods.GracePeriod(pod)}
	}
	if name, limit, over := s.k.volumes.static.OverLimit(pod); over {
		// As the kubelet's eviction of a pod past a local storage limit:
		// at once, with no grace.
		msg := fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q. ", name, limit.String())
		return &podEnd{reason: evictedReason, message: msg, condition: &corev1.PodCondition{Type: corev1.DisruptionTarget,
			Status: corev1.ConditionTrue, Reason: terminationByKubelet, Message: msg}}
	}
	return nil
}
