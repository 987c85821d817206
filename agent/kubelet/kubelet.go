// Package kubelet is the part of cairn-agent that runs the Pods bound to
// the node, with a pod worker made from Config.Pods, once the node is a member of
// the cluster (agent/node): it watches them with the member's informers,
// syncs each with the worker, reports their status, and answers the
// worker's questions about the API (the ConfigMaps, Secrets and Services
// the pods refer to, their volumes, the Events it records) with the
// node's own credentials.
//
//	err := kubelet.Run(ctx, member, kubelet.Config{
//		Dir: "/var/lib/cairn/kubelet", RuntimeInfo: cri, Pods: kubelet.NewPodConfig(cluster, cri, logRoot),
//	})
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/agent/node"
)

// Config is what Run needs.
type Config struct {
	// Dir holds the pods' state: pods/ keeps their volumes.
	Dir string
	// RuntimeInfo tells the container runtime's name, the scheme of its
	// container IDs.
	RuntimeInfo node.RuntimeInfo
	// Pods runs the Pods bound to the node: they are watched with the
	// node's informer and synced with a pod worker made from this config
	// and the node's client (see newPodWorker), and their status is
	// reported (see syncPods).
	Pods *PodConfig
	// PodResync is how often each pod is synced when nothing changed: the
	// runtime's events and relists (pleg) and probe results wake a pod
	// when something did. 0 means 10 s.
	PodResync time.Duration
	// Log receives what happens; nil means slog.Default().
	Log *slog.Logger
	// Metrics, if set, gets the pod loop's Prometheus metrics: pod start
	// latency, pod worker wakeups.
	Metrics prometheus.Registerer
	// ProbeMetrics, if set, gets the probes' runs as the kubelet counts
	// them (prober_probe_total), which its server serves at
	// /metrics/probes.
	ProbeMetrics prometheus.Registerer

	// plegRelist is how often the runtime is listed whole to catch what
	// its events missed: 0 means every 5 s, a negative duration never, so
	// that a test proves what the CRI's events do alone.
	plegRelist time.Duration
}

func (c *Config) setDefaults() {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.PodResync == 0 {
		c.PodResync = 10 * time.Second
	}
}

func (c *Config) check() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("no state directory"))
	}
	if c.RuntimeInfo == nil {
		errs = append(errs, errors.New("no runtime info"))
	}
	if c.Pods == nil {
		errs = append(errs, errors.New("no pod worker"))
	}
	return errors.Join(errs...)
}

// requestTimeout bounds each call to the API server.
const requestTimeout = 10 * time.Second

// Run runs the node's pods with m's client and informers until ctx ends;
// then it returns nil once everything it started has stopped. What fails
// in a pod's sync is logged and retried there; Run returns an error when
// the pod loop cannot start (a Config that cannot work, a worker that
// cannot be made), for its caller to start it again.
func Run(ctx context.Context, m *node.Member, cfg Config) error {
	k, err := newKubelet(m, cfg)
	if err != nil {
		return err
	}
	return k.syncPods(ctx, m.Node())
}

// kubelet is one run of Run.
type kubelet struct {
	cfg     Config
	log     *slog.Logger
	member  *node.Member
	client  kubernetes.Interface // the member's: authenticates as the node
	metrics *metrics
}

func newKubelet(m *node.Member, cfg Config) (*kubelet, error) {
	cfg.setDefaults()
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("kubelet config: %w", err)
	}
	metrics, err := newMetrics(cfg.Metrics, cfg.ProbeMetrics)
	if err != nil {
		return nil, fmt.Errorf("kubelet metrics: %w", err)
	}
	return &kubelet{cfg: cfg, log: cfg.Log.With("node", m.Name), member: m, client: m.Client, metrics: metrics}, nil
}
