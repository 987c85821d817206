package kubelet

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// The status of a pod ended by the node's shutdown, in the kubelet's
// words.
const (
	shutdownReason  = "Terminated"
	shutdownMessage = "Pod was terminated in response to imminent node shutdown."
)

// nodeShutdown is the node's shutdown under way: the pods that are not
// critical end first, within grace-critical, then the critical ones
// within critical.
type nodeShutdown struct {
	grace, critical time.Duration
	criticalToo     atomic.Bool
}

// endOf is how the shutdown ends pod now; nil while its turn has not
// come.
func (n *nodeShutdown) endOf(pod *corev1.Pod) *podEnd {
	grace := n.grace - n.critical
	if pods.IsCritical(pod) {
		if !n.criticalToo.Load() {
			return nil
		}
		grace = n.critical
	}
	return &podEnd{
		reason: shutdownReason, message: shutdownMessage, grace: min(grace, pods.GracePeriod(pod)),
		condition: &corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: terminationByKubelet, Message: shutdownMessage},
	}
}

// Shutdown ends the node's pods because the node shuts down, as the
// kubelet's graceful node shutdown does: the pods that are not critical
// first, each given at most grace-critical to stop, then the critical
// ones, given at most critical; each ends Failed, reason Terminated, with
// the DisruptionTarget condition. Nothing the node runs starts again. It
// returns once every pod has stopped, or grace has passed, or ctx ends.
func (k *Kubelet) Shutdown(ctx context.Context, grace, critical time.Duration) {
	s := k.syncer
	n := &nodeShutdown{grace: grace, critical: critical}
	if !s.shutdown.CompareAndSwap(nil, n) {
		return // under way
	}
	start := time.Now()
	k.log.Info("node shutting down: ending the pods", "grace", grace, "critical pods' part", critical)
	regular := s.endPods(ctx, grace-critical, func(p *corev1.Pod) bool { return !pods.IsCritical(p) })
	n.criticalToo.Store(true)
	crit := s.endPods(ctx, critical, pods.IsCritical)
	k.log.Info("node shutting down: pods ended", "pods", regular, "critical pods", crit, "took", time.Since(start).Round(time.Millisecond))
}

// endPods wakes the workers of the pods that which picks for the node's
// shutdown to end them, and waits up to within (and a little more, for
// the status writes) for each to have ended; it returns how many it
// waited for.
func (s *podSyncer) endPods(ctx context.Context, within time.Duration, which func(*corev1.Pod) bool) int {
	ctx, cancel := context.WithTimeout(ctx, within+5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	n := 0
	for _, w := range s.podWorkers() {
		pod, phase, _, _ := w.latest()
		if pod == nil || phase != podSyncing || terminal(pod.Status.Phase) || !which(pod) {
			continue
		}
		n++
		w.poke()
		wg.Go(func() {
			select {
			case <-w.ended:
			case <-ctx.Done():
			}
		})
	}
	wg.Wait()
	return n
}
