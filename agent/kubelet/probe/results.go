package probe

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Results is the cache of the probes' verdicts, which a Manager writes
// and the pod worker reads: Ready and Started answer from it, and
// Updates tells, by pod, when a verdict changed or a container was
// stopped for failing its probe. Its methods may be called from many
// goroutines.
type Results struct {
	mu sync.Mutex
	m  map[key]verdict
	// updates is buffered so that a probe rarely waits for the reader.
	updates chan Update
}

// verdict is a probe's last result for one CRI container.
type verdict struct {
	containerID string
	ok          bool
}

// Update tells that the verdict of a pod's container's probe changed, or
// that the container was stopped for failing it.
type Update struct {
	UID       types.UID
	Container string
	Kind      Kind
}

// NewResults returns an empty cache.
func NewResults() *Results {
	return &Results{m: map[key]verdict{}, updates: make(chan Update, 64)}
}

// Updates is where the cache tells what changed. It is never closed.
func (r *Results) Updates() <-chan Update { return r.updates }

// Started says whether the container with containerID of the pod
// started: it runs and its startup probe, if any, succeeded.
func (r *Results) Started(pod *corev1.Pod, name, containerID string) bool {
	c := container(pod, name)
	if c == nil || c.StartupProbe == nil {
		return true
	}
	return r.get(key{pod.UID, name, Startup}, containerID)
}

// Ready says whether the running container with containerID is ready:
// started, and its readiness probe, if any, succeeded.
func (r *Results) Ready(pod *corev1.Pod, name, containerID string) bool {
	if !r.Started(pod, name, containerID) {
		return false
	}
	c := container(pod, name)
	if c == nil || c.ReadinessProbe == nil {
		return true
	}
	return r.get(key{pod.UID, name, Readiness}, containerID)
}

func (r *Results) get(k key, containerID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[k]
	return ok && v.containerID == containerID && v.ok
}

// reset starts the verdict of k afresh for the container containerID.
func (r *Results) reset(k key, containerID string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[k] = verdict{containerID: containerID, ok: ok}
}

// set records the verdict of k for the container containerID; it says
// whether it changed.
func (r *Results) set(k key, containerID string, ok bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, found := r.m[k]
	if !found || v.containerID != containerID || v.ok == ok {
		return false
	}
	r.m[k] = verdict{containerID: containerID, ok: ok}
	return true
}

func (r *Results) remove(k key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, k)
}

// tell sends u, unless ctx (the probe's) ends first.
func (r *Results) tell(ctx context.Context, u Update) {
	select {
	case r.updates <- u:
	case <-ctx.Done():
	}
}
