package kubelet

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/agent/node/host"
)

// evictionInterval is how often the node looks for pressure. The
// kubelet's eviction manager looks every 10 s and hears of memory sooner
// from the kernel; these looks are cheap (/proc/meminfo, statfs, the
// runtime's image filesystem), so looking often does both.
const evictionInterval = 2 * time.Second

// watchPressure evicts a pod whenever the node crosses one of its hard
// eviction thresholds, one pod at a time, until ctx ends.
func (s *podSyncer) watchPressure(ctx context.Context) {
	for sleep(ctx, s.k.cfg.evictionInterval) {
		s.evictOnce(ctx)
	}
}

// evictOnce evicts the pod that the first threshold crossed ranks first,
// unless the pod it evicted last has not ended yet: at once, past a hard
// threshold; past a soft one crossed for its grace period, giving the pod
// at most the soft eviction's MaxPodGracePeriod to stop.
func (s *podSyncer) evictOnce(ctx context.Context) {
	sig, soft := s.pressure(ctx)
	if sig == nil {
		return
	}
	if uid := s.lastEvicted; uid != "" {
		s.mu.Lock()
		w := s.workers[uid]
		s.mu.Unlock()
		if w != nil {
			select {
			case <-w.ended:
			default:
				return // its end may relieve the pressure: wait for it
			}
		}
	}
	victim, detail := s.rank(ctx, sig)
	if victim == nil {
		s.k.log.Warn("the node is under pressure and has no pod to evict", "signal", sig.Name,
			"threshold", sig.Threshold.String(), "available", sig.Available.String())
		return
	}
	msg := fmt.Sprintf("The node was low on resource: %s. Threshold quantity: %s, available: %s. %s",
		sig.Resource, sig.Threshold.String(), sig.Available.String(), detail)
	s.k.log.Info("evicting a pod: the node is under pressure", "pod", victim.Namespace+"/"+victim.Name, "signal", sig.Name, "message", msg)
	var grace time.Duration
	if soft {
		grace = min(pods.GracePeriod(victim), s.k.cfg.Soft.MaxPodGracePeriod)
	}
	s.evicted.Store(victim.UID, &podEnd{reason: evictedReason, message: msg, grace: grace, condition: &corev1.PodCondition{
		Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: terminationByKubelet, Message: msg}})
	s.lastEvicted = victim.UID
	s.mu.Lock()
	w := s.workers[victim.UID]
	s.mu.Unlock()
	if w != nil {
		w.poke()
	}
}

// SoftEviction is the node's soft eviction, the kubelet's evictionSoft:
// a threshold crossed for as long as its grace period evicts a pod, which
// gets at most MaxPodGracePeriod to stop.
type SoftEviction struct {
	// Thresholds are the soft thresholds; a zero field is none.
	Thresholds node.Thresholds
	// GracePeriods are how long each signal's threshold must stay
	// crossed, by signal name (memory.available).
	GracePeriods      map[string]time.Duration
	MaxPodGracePeriod time.Duration
}

// pressure is the signal of the first hard threshold the node crosses
// now, else of the first soft one crossed for its grace period (soft
// then says so); nil if none.
func (s *podSyncer) pressure(ctx context.Context) (sig *node.Signal, soft bool) {
	if sig := s.crossed(ctx, s.k.cfg.Thresholds.WithDefaults()); sig != nil {
		return sig, false
	}
	if s.k.cfg.Soft.Thresholds == (node.Thresholds{}) {
		return nil, false
	}
	sig = s.crossed(ctx, s.k.cfg.Soft.Thresholds)
	if sig == nil {
		clear(s.softSince)
		return nil, false
	}
	now := time.Now()
	since, ok := s.softSince[sig.Name]
	if !ok {
		clear(s.softSince) // another signal's, if any, is no longer the first
		s.softSince[sig.Name] = now
		since = now
	}
	if now.Sub(since) < s.k.cfg.Soft.GracePeriods[sig.Name] {
		return nil, false
	}
	return sig, true
}

// crossed is the first of the thresholds t that the node crosses now, nil
// if none: memory, the kubelet directory's filesystem, the images'
// filesystem, process IDs.
func (s *podSyncer) crossed(ctx context.Context, t node.Thresholds) *node.Signal {
	if m, err := host.ReadMemory(); err == nil {
		if sig := t.Memory(m); sig != nil {
			return sig
		}
	}
	if fs, err := host.StatFS(s.k.cfg.Dir); err == nil {
		if sig := t.Nodefs(fs); sig != nil {
			return sig
		}
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	dir, err := cri.ImageFilesystem(rctx, s.k.cfg.Pods.Images)
	cancel()
	if err == nil {
		if fs, err := host.StatFS(dir); err == nil {
			if sig := t.Imagefs(fs); sig != nil {
				return sig
			}
		}
	}
	if p, err := host.ReadPIDs(); err == nil {
		if sig := t.PIDs(p); sig != nil {
			return sig
		}
	}
	return nil
}

// candidate is a pod that may be evicted, with its usage of the resource
// short and what it requests of it.
type candidate struct {
	pod            *corev1.Pod
	usage, request int64
	top            string // the container using the most
	topUsage       int64
}

// rank returns the pod to evict for sig, as the kubelet ranks them: those
// using more than they request first, then the lower priority, then the
// larger use beyond the request; critical and static pods are never
// evicted. detail says why, in the kubelet's words.
func (s *podSyncer) rank(ctx context.Context, sig *node.Signal) (*corev1.Pod, string) {
	usage := s.usage(ctx, sig.Resource)
	var cs []candidate
	for _, w := range s.podWorkers() {
		pod, phase, _, _ := w.latest()
		if pod == nil || phase != podSyncing || terminal(pod.Status.Phase) || pods.IsCritical(pod) || isStatic(pod) {
			continue
		}
		if _, done := s.evicted.Load(pod.UID); done {
			continue
		}
		c := candidate{pod: pod, request: requests(pod, sig.Resource)}
		for name, n := range usage[pod.UID] {
			c.usage += n
			if n > c.topUsage {
				c.top, c.topUsage = name, n
			}
		}
		cs = append(cs, c)
	}
	if len(cs) == 0 {
		return nil, ""
	}
	priority := func(p *corev1.Pod) int32 { return ptr.Deref(p.Spec.Priority, 0) }
	slices.SortFunc(cs, func(a, b candidate) int {
		aOver, bOver := a.usage > a.request, b.usage > b.request
		switch {
		case aOver && !bOver:
			return -1
		case bOver && !aOver:
			return 1
		}
		return cmp.Or(cmp.Compare(priority(a.pod), priority(b.pod)), cmp.Compare(b.usage-b.request, a.usage-a.request))
	})
	v := cs[0]
	detail := ""
	if v.top != "" && sig.Resource != "pids" {
		detail = fmt.Sprintf("Container %s was using %s, request is %s, has larger consumption of %s. ", v.top,
			resource.NewQuantity(v.topUsage, resource.BinarySI), resource.NewQuantity(v.request, resource.BinarySI), sig.Resource)
	}
	return v.pod, detail
}

// requests sums what pod's containers request of r.
func requests(pod *corev1.Pod, r corev1.ResourceName) int64 {
	var n int64
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Requests[r]; ok {
			n += q.Value()
		}
	}
	return n
}

// usage is what each pod's containers use of r, by pod UID and container
// name, from the runtime's stats: the memory working set, or for disk the
// writable layer; nothing for process IDs.
func (s *podSyncer) usage(ctx context.Context, r corev1.ResourceName) map[types.UID]map[string]int64 {
	out := map[types.UID]map[string]int64{}
	if r != corev1.ResourceMemory && r != corev1.ResourceEphemeralStorage {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := s.k.cfg.Pods.Runtime.ListContainerStats(ctx, &criv1.ListContainerStatsRequest{})
	if err != nil {
		s.k.log.Warn("the containers' use, to rank pods for eviction", "err", err)
		return out
	}
	for _, st := range resp.Stats {
		if st.Attributes == nil {
			continue
		}
		uid := types.UID(st.Attributes.Labels[pods.LabelPodUID])
		var n uint64
		switch {
		case r == corev1.ResourceMemory && st.Memory != nil && st.Memory.WorkingSetBytes != nil:
			n = st.Memory.WorkingSetBytes.Value
		case r == corev1.ResourceEphemeralStorage && st.WritableLayer != nil && st.WritableLayer.UsedBytes != nil:
			n = st.WritableLayer.UsedBytes.Value
		}
		if out[uid] == nil {
			out[uid] = map[string]int64{}
		}
		out[uid][st.Attributes.Metadata.GetName()] += int64(n)
	}
	return out
}
