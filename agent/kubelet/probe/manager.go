package probe

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/handler"
)

// Stopper stops a container that failed its liveness or startup probe,
// giving it grace after SIGTERM: the pod worker's StopUnhealthy, which
// runs the preStop hook and has the container restarted.
type Stopper interface {
	StopUnhealthy(ctx context.Context, pod *corev1.Pod, name, containerID string, grace time.Duration) error
}

// Events records an event about a pod's container: a failed probe is
// told as an Unhealthy warning, an httpGet redirected to another host as
// a ProbeWarning.
type Events interface {
	Event(pod *corev1.Pod, container, eventtype, reason, format string, args ...any)
}

// Config is what a Manager needs.
type Config struct {
	// Runtime runs exec probes.
	Runtime criv1.RuntimeServiceClient
	// Results receives the verdicts.
	Results *Results
	Stopper Stopper
	// Events, if set, records the failed probes.
	Events Events
	// Probed, if set, is told each probe's run, of which pod's container,
	// and its error (the kubelet counts them in its metrics).
	Probed func(pod *corev1.Pod, container string, kind Kind, err error)
	// Log receives what happens; nil means slog.Default().
	Log *slog.Logger
}

// Manager runs the probes of the node's running containers and keeps
// their verdicts in its Results. Its methods may be called from many
// goroutines.
type Manager struct {
	cfg Config

	mu      sync.Mutex
	workers map[key]*worker
}

// New returns the Manager of cfg.
func New(cfg Config) (*Manager, error) {
	if cfg.Runtime == nil || cfg.Results == nil || cfg.Stopper == nil {
		return nil, errors.New("probe manager: no runtime, results or stopper")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Manager{cfg: cfg, workers: map[key]*worker{}}, nil
}

type key struct {
	uid       types.UID
	container string
	kind      Kind
}

// worker probes one container with one probe; its verdicts are in the
// Results under its key while it is the key's worker.
type worker struct {
	containerID string
	cancel      context.CancelFunc
	// now asks the worker to probe at once rather than at its next
	// period: a readiness probe, once the startup probe succeeded.
	now chan struct{}
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
			w := &worker{containerID: r.ContainerID, cancel: cancel, now: make(chan struct{}, 1)}
			m.workers[k] = w
			// Readiness and startup start false, liveness true.
			m.cfg.Results.reset(k, r.ContainerID, kind == Liveness)
			go m.run(ctx, k, w, pod, c, p, host)
		}
	}
	for k, w := range m.workers {
		if k.uid == pod.UID {
			if id, ok := want[k]; !ok || id != w.containerID {
				m.stop(k, w)
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
			m.stop(k, w)
		}
	}
}

// Terminating stops the liveness and startup probes of a pod being
// killed; its readiness probes go on, as the kubelet's do since 1.27, so
// that its readiness shows while its containers stop. The verdicts stay
// until Remove: readiness builds on the startup probe's.
func (m *Manager) Terminating(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, w := range m.workers {
		if k.uid == uid && k.kind != Readiness {
			w.cancel()
		}
	}
}

// stop ends the worker w of k and forgets its verdicts; m.mu is held.
func (m *Manager) stop(k key, w *worker) {
	w.cancel()
	delete(m.workers, k)
	m.cfg.Results.remove(k)
}

// kindTitle is how events name a kind of probe.
var kindTitle = map[Kind]string{Startup: "Startup", Liveness: "Liveness", Readiness: "Readiness"}

// set records a verdict of w, if it is still k's worker; it says whether
// the verdict changed.
func (m *Manager) set(k key, w *worker, v bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.workers[k] == w && m.cfg.Results.set(k, w.containerID, v)
}

// probeNow has the readiness probe of k's container, if any, run at once:
// its startup probe just succeeded, and the container is ready as soon as
// that probe says, not a readiness period later.
func (m *Manager) probeNow(k key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if w := m.workers[key{k.uid, k.container, Readiness}]; w != nil {
		select {
		case w.now <- struct{}{}:
		default:
		}
	}
}

// run probes until ctx ends, a startup probe succeeds, or a liveness or
// startup probe fails and the container is stopped.
func (m *Manager) run(ctx context.Context, k key, w *worker, pod *corev1.Pod, c *corev1.Container, p *corev1.Probe, host string) {
	log := m.cfg.Log.With("pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "probe", k.kind)
	period := seconds(p.PeriodSeconds, DefaultPeriod)
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
	notBefore := time.Now().Add(time.Duration(p.InitialDelaySeconds) * time.Second)
	var oks, fails int
	target := handler.Target{Container: c, ContainerID: w.containerID, Host: host}
	if m.cfg.Events != nil {
		target.Warn = func(msg string) {
			m.cfg.Events.Event(pod, c.Name, corev1.EventTypeWarning, "ProbeWarning", "%s probe warning: %s", kindTitle[k.kind], msg)
		}
	}
	t := time.NewTimer(time.Until(notBefore))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.now:
			if time.Now().Before(notBefore) {
				continue // the initial delay holds, and the timer ends it
			}
		}
		t.Reset(period) // from this run: a probe asked for now moves the next
		if k.kind != Startup && !m.cfg.Results.Started(pod, c.Name, w.containerID) {
			continue // startup gates the others
		}
		err := Do(ctx, m.cfg.Runtime, p, target)
		if ctx.Err() != nil {
			return
		}
		if m.cfg.Probed != nil {
			m.cfg.Probed(pod, c.Name, k.kind, err)
		}
		if err == nil {
			oks, fails = oks+1, 0
		} else {
			oks, fails = 0, fails+1
			log.Debug("probe failed", "err", err, "failures", fails)
			if m.cfg.Events != nil {
				m.cfg.Events.Event(pod, c.Name, corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kindTitle[k.kind], err)
			}
		}
		switch {
		case oks >= success:
			if m.set(k, w, true) {
				log.Info("probe succeeded")
				m.cfg.Results.tell(ctx, Update{UID: pod.UID, Container: c.Name, Kind: k.kind})
			}
			if k.kind == Startup {
				m.probeNow(k)
				return
			}
		case fails >= failure:
			changed := m.set(k, w, false)
			if k.kind == Readiness {
				if changed {
					log.Info("probe failed: container not ready", "err", err)
					m.cfg.Results.tell(ctx, Update{UID: pod.UID, Container: c.Name, Kind: k.kind})
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
			err := m.cfg.Stopper.StopUnhealthy(sctx, pod, c.Name, w.containerID, grace)
			cancel()
			if ctx.Err() != nil {
				return // the pod's probes were removed meanwhile
			}
			if err != nil {
				log.Warn("stop container failing its probe", "err", err)
				continue
			}
			m.cfg.Results.tell(ctx, Update{UID: pod.UID, Container: c.Name, Kind: k.kind})
			return
		}
	}
}

// container is pod's container named name, sidecars (init containers)
// included, which have probes too; nil if there is none.
func container(pod *corev1.Pod, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

// RemoveAll stops every probe.
func (m *Manager) RemoveAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, w := range m.workers {
		m.stop(k, w)
	}
}
