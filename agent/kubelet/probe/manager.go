package probe

import (
	"context"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/handler"
)

// Manager runs the probes of the node's running containers. Its fields
// are set before the first call; its methods may be called from many
// goroutines.
type Manager struct {
	Runtime criv1.RuntimeServiceClient
	// Stop stops a container that failed its liveness or startup probe,
	// giving it grace after SIGTERM; the pod worker's StopUnhealthy,
	// which runs the preStop hook and has the container restarted.
	Stop func(ctx context.Context, pod *corev1.Pod, name, containerID string, grace time.Duration) error
	// Event, if set, records an event about a pod's container: a failed
	// probe is told as an Unhealthy warning.
	Event func(pod *corev1.Pod, container, eventtype, reason, format string, args ...any)
	Log   *slog.Logger
	// Changed is called, from a probe's goroutine, when a result of a
	// pod's container changed or a container was stopped for failing.
	Changed func(types.UID)
	// Scale multiplies every probe's delay and period; 0 means 1. Tests
	// shorten probes with it.
	Scale float64

	mu      sync.Mutex
	workers map[key]*worker
}

type key struct {
	uid       types.UID
	container string
	kind      Kind
}

// worker probes one container with one probe.
type worker struct {
	containerID string
	cancel      context.CancelFunc
	// result: the probe's last verdict. Readiness and startup start
	// false, liveness true.
	result bool
}

// Running is a running container of a pod, as the pod worker saw it.
type Running struct {
	Name        string
	ContainerID string
}

// Update makes the probes of pod's running containers run, against host
// (the pod's IP, or the node's), and stops those of containers that no
// longer run. A container with a new ID is probed afresh.
func (m *Manager) Update(pod *corev1.Pod, host string, running []Running) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.workers == nil {
		m.workers = map[key]*worker{}
	}
	want := map[key]string{}
	for _, r := range running {
		c := container(pod, r.Name)
		if c == nil {
			continue
		}
		for kind, p := range map[Kind]*corev1.Probe{Startup: c.StartupProbe, Liveness: c.LivenessProbe, Readiness: c.ReadinessProbe} {
			if p == nil {
				continue
			}
			k := key{pod.UID, c.Name, kind}
			want[k] = r.ContainerID
			if w := m.workers[k]; w != nil && w.containerID == r.ContainerID {
				continue
			} else if w != nil {
				w.cancel()
			}
			ctx, cancel := context.WithCancel(context.Background())
			w := &worker{containerID: r.ContainerID, cancel: cancel, result: kind == Liveness}
			m.workers[k] = w
			go m.run(ctx, k, w, pod, c, p, host)
		}
	}
	for k, w := range m.workers {
		if k.uid == pod.UID {
			if id, ok := want[k]; !ok || id != w.containerID {
				w.cancel()
				delete(m.workers, k)
			}
		}
	}
}

// Remove stops the probes of a pod.
func (m *Manager) Remove(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, w := range m.workers {
		if k.uid == uid {
			w.cancel()
			delete(m.workers, k)
		}
	}
}

// Started says whether the container with containerID of the pod
// started: it runs and its startup probe, if any, succeeded.
func (m *Manager) Started(pod *corev1.Pod, name, containerID string) bool {
	c := container(pod, name)
	if c == nil || c.StartupProbe == nil {
		return true
	}
	return m.result(key{pod.UID, name, Startup}, containerID)
}

// Ready says whether the running container with containerID is ready:
// started, and its readiness probe, if any, succeeded.
func (m *Manager) Ready(pod *corev1.Pod, name, containerID string) bool {
	if !m.Started(pod, name, containerID) {
		return false
	}
	c := container(pod, name)
	if c == nil || c.ReadinessProbe == nil {
		return true
	}
	return m.result(key{pod.UID, name, Readiness}, containerID)
}

func (m *Manager) result(k key, containerID string) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.workers[k]
	return w != nil && w.containerID == containerID && w.result
}

// kindTitle is how events name a kind of probe.
var kindTitle = map[Kind]string{Startup: "Startup", Liveness: "Liveness", Readiness: "Readiness"}

// set records a verdict; it says whether it changed.
func (m *Manager) set(k key, w *worker, v bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.workers[k] != w || w.result == v {
		return false
	}
	w.result = v
	return true
}

func (m *Manager) started(pod *corev1.Pod, c *corev1.Container, containerID string) bool {
	return c.StartupProbe == nil || m.result(key{pod.UID, c.Name, Startup}, containerID)
}

func (m *Manager) scale(d time.Duration) time.Duration {
	if m.Scale <= 0 {
		return d
	}
	return time.Duration(float64(d) * m.Scale)
}

// run probes until ctx ends, a startup probe succeeds, or a liveness or
// startup probe fails and the container is stopped.
func (m *Manager) run(ctx context.Context, k key, w *worker, pod *corev1.Pod, c *corev1.Container, p *corev1.Probe, host string) {
	log := m.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "probe", k.kind)
	period := m.scale(seconds(p.PeriodSeconds, DefaultPeriod))
	success, failure := int(p.SuccessThreshold), int(p.FailureThreshold)
	if success <= 0 {
		success = DefaultSuccessThreshold
	}
	if failure <= 0 {
		failure = DefaultFailureThreshold
	}
	if k.kind != Readiness {
		success = 1 // the API requires 1 for liveness and startup
	}
	wait := m.scale(time.Duration(p.InitialDelaySeconds) * time.Second)
	var oks, fails int
	target := handler.Target{Container: c, ContainerID: w.containerID, Host: host}
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = period
		if k.kind != Startup && !m.started(pod, c, w.containerID) {
			continue // startup gates the others
		}
		err := Do(ctx, m.Runtime, p, target)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			oks, fails = oks+1, 0
		} else {
			oks, fails = 0, fails+1
			log.Debug("probe failed", "err", err, "failures", fails)
			if m.Event != nil {
				m.Event(pod, c.Name, corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kindTitle[k.kind], err)
			}
		}
		switch {
		case oks >= success:
			if m.set(k, w, true) {
				log.Info("probe succeeded")
				m.changed(pod.UID)
			}
			if k.kind == Startup {
				return
			}
		case fails >= failure:
			changed := m.set(k, w, false)
			if k.kind == Readiness {
				if changed {
					log.Info("probe failed: container not ready", "err", err)
					m.changed(pod.UID)
				}
				continue
			}
			log.Info("probe failed: stopping the container", "err", err)
			grace := 30 * time.Second
			if p.TerminationGracePeriodSeconds != nil {
				grace = time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
			} else if pod.Spec.TerminationGracePeriodSeconds != nil {
				grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
			}
			sctx, cancel := context.WithTimeout(ctx, grace+time.Minute)
			err := m.Stop(sctx, pod, c.Name, w.containerID, grace)
			cancel()
			if ctx.Err() != nil {
				return // the pod's probes were removed meanwhile
			}
			if err != nil {
				log.Warn("stop container failing its probe", "err", err)
				continue
			}
			m.changed(pod.UID)
			return
		}
	}
}

func (m *Manager) changed(uid types.UID) {
	if m.Changed != nil {
		m.Changed(uid)
	}
}

func container(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

// RemoveAll stops every probe.
func (m *Manager) RemoveAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, w := range m.workers {
		w.cancel()
		delete(m.workers, k)
	}
}
