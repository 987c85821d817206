// Package kubelet is the part of cairn-agent that runs the node's pods
// with one pod worker made from Config.Pods, fed by two sources as the
// kubelet's are: the static pods, whose manifests are files on the node
// (Config.StaticPodDir), from the node's boot and whether or not an API
// server answers; and, once the node is a member of the cluster
// (agent/node), the Pods bound to it in the API, watched with the
// member's informers. It syncs each pod with the worker, reports the API
// pods' status, keeps a mirror Pod of each static pod in the API, and
// answers the worker's questions about the API (the ConfigMaps, Secrets
// and Services the pods refer to, their volumes, the Events it records)
// with the node's own credentials.
//
//	k, err := kubelet.New(kubelet.Config{
//		Dir: "/var/lib/cairn/kubelet", RuntimeInfo: cri, Pods: kubelet.NewPodConfig(cluster, cri, logRoot),
//		NodeName: "node-1", StaticPodDir: layout.StaticPodDir,
//	})
//	go k.Run(ctx)                               // from the boot: static pods
//	node.Component{Name: "kubelet", Run: k.Join} // once joined: the API's pods, mirror pods
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/cairn-os/cairn/agent/kubelet/volumes"
	"github.com/cairn-os/cairn/agent/node"
)

// Config is what New needs.
type Config struct {
	// Dir holds the pods' state: pods/ keeps their volumes.
	Dir string
	// RuntimeInfo tells the container runtime's name, the scheme of its
	// container IDs.
	RuntimeInfo node.RuntimeInfo
	// Pods runs the node's pods: they are synced with a pod worker made
	// from this config (see newPodWorker), and the API pods' status is
	// reported (see syncOnce).
	Pods *PodConfig
	// NodeName is the node's name, which its static pods are bound to and
	// named after; the package's Run takes the member's when empty.
	NodeName string
	// StaticPodDir, if set, holds the static pods' manifests (static.go),
	// layout.StaticPodDir on a node.
	StaticPodDir string
	// CSI, if set, mounts the pods' volumes of CSI drivers
	// (agent/csi.Plugins, whose directory is Dir).
	CSI volumes.CSI
	// Thresholds are the hard eviction thresholds: crossing one, the
	// node evicts pods; zero fields take node.DefaultThresholds'.
	Thresholds node.Thresholds
	// Soft is the soft eviction; none if zero.
	Soft SoftEviction
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
	// staticResync is how often the static pods' directory is read again
	// besides when it tells of a change: 0 means 20 s.
	staticResync time.Duration
	// evictionInterval is how often the node looks for pressure: 0 means
	// evictionInterval.
	evictionInterval time.Duration
}

func (c *Config) setDefaults() {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.PodResync == 0 {
		c.PodResync = 10 * time.Second
	}
	if c.staticResync == 0 {
		c.staticResync = 20 * time.Second
	}
	if c.evictionInterval == 0 {
		c.evictionInterval = evictionInterval
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
	if c.StaticPodDir != "" && c.NodeName == "" {
		errs = append(errs, errors.New("static pods but no node name to bind them to"))
	}
	return errors.Join(errs...)
}

// requestTimeout bounds each call to the API server.
const requestTimeout = 10 * time.Second

// Run runs the node's pods, the static ones and m's, until ctx ends; then
// it returns nil once everything it started has stopped. It is New, Run
// and Join together, for a node whose pod loop starts once it joined.
// What fails in a pod's sync is logged and retried there; Run returns an
// error when the pod loop cannot start (a Config that cannot work, a
// worker that cannot be made), for its caller to start it again.
func Run(ctx context.Context, m *node.Member, cfg Config) error {
	if cfg.NodeName == "" {
		cfg.NodeName = m.Name
	}
	k, err := New(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { k.Run(ctx) })
	err = k.Join(ctx, m)
	cancel()
	wg.Wait()
	return err
}

// Kubelet is the node's pod loop: Run runs it from the node's boot, Join
// adds the API's pods once the node joined.
type Kubelet struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	syncer  *podSyncer
	refs    *joinedRefs
	volumes *podVolumes
	qos     *qosCgroups
	events  record.EventBroadcaster
	stop    func() // stops sending events

	// member is the node's membership once Join was called: nil before.
	member atomic.Pointer[node.Member]
	// started is closed once Run read the static pods a first time, so
	// that Join's housekeeping never takes their containers for orphans.
	started chan struct{}
}

// New makes the pod loop of cfg, with its pod worker.
func New(cfg Config) (*Kubelet, error) {
	cfg.setDefaults()
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("kubelet config: %w", err)
	}
	metrics, err := newMetrics(cfg.Metrics, cfg.ProbeMetrics)
	if err != nil {
		return nil, fmt.Errorf("kubelet metrics: %w", err)
	}
	k := &Kubelet{cfg: cfg, log: cfg.Log.With("node", cfg.NodeName), metrics: metrics, started: make(chan struct{})}
	if err := k.newSyncer(); err != nil {
		return nil, err
	}
	return k, nil
}

// hostNode is the Node the pods run on as last watched once the node
// joined; before, a Node with nothing known of it.
func (k *Kubelet) hostNode() *corev1.Node {
	if m := k.member.Load(); m != nil {
		return m.Node()
	}
	return &corev1.Node{}
}

// client is the node's client once it joined; nil before, when only
// static pods run, which nothing reads or writes in the API for.
func (k *Kubelet) client() kubernetes.Interface {
	if m := k.member.Load(); m != nil {
		return m.Client
	}
	return nil
}
