// Package kubelet is the part of cairn-agent that does the kubelet's work
// for a Kubernetes cluster: it joins the cluster, keeps the node alive
// there and, given a pod worker (Config.Pods), runs the Pods bound to it.
//
// Run gets the node's credentials — a client certificate by TLS
// bootstrapping with a bootstrap token, stored and rotated before it
// expires, or the kubeconfig of the machine config —, registers the Node
// (or adopts an existing one), renews the node's Lease and reports the
// node's status: addresses, capacity, conditions. Everything it does after
// bootstrapping it does as the node itself, system:node:NAME, as the API
// server's Node authorizer expects.
//
//	err := kubelet.Run(ctx, kubelet.Config{
//		NodeName: cfg.Machine.Hostname, Cluster: *cfg.Cluster, Dir: "/var/lib/cairn/kubelet",
//		RuntimeInfo: cri, RuntimeStatus: cri, Version: version.Version,
//	})
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/machineconfig"
)

// KubernetesVersion is the Kubernetes release whose API the node speaks;
// the Node reports it, with Cairn's version, as its kubelet version.
const KubernetesVersion = "v1.37.2"

// Config is what Run needs.
type Config struct {
	// NodeName is the Node's name: the machine's hostname.
	NodeName string
	// Cluster is the machine config's cluster section, with defaults.
	Cluster machineconfig.Cluster
	// Dir holds the node's state: pki/ keeps the client certificate,
	// pods/ the pods' volumes. The filesystem it is on is the node's
	// ephemeral storage.
	Dir string
	// RuntimeInfo and RuntimeStatus tell about the container runtime.
	RuntimeInfo   RuntimeInfo
	RuntimeStatus RuntimeStatus
	// OnJoined, if set, runs once the Node is registered, with the node's
	// own client, until ctx ends: the agent starts its Service dataplane
	// there.
	OnJoined func(ctx context.Context, client kubernetes.Interface, node *corev1.Node)
	// Pods, if set, runs the Pods bound to the node once it joined: they
	// are watched with the node's client and synced with a pod worker made
	// from this config and the node's client (see newPodWorker), and
	// their status is reported (see syncPods). Nil runs no pods.
	Pods *PodConfig
	// PodResync is how often each pod is synced when nothing changed: the
	// runtime's events and relists (pleg) and probe results wake a pod
	// when something did. 0 means 10 s.
	PodResync time.Duration
	// Version is Cairn's version.
	Version string
	// Log receives what happens; nil means slog.Default().
	Log *slog.Logger
	// Metrics, if set, gets the kubelet part's Prometheus metrics: pod
	// start latency, Lease renewals.
	Metrics prometheus.Registerer

	// LeaseInterval is how often the Lease is renewed; 0 means 10 s.
	LeaseInterval time.Duration
	// StatusInterval is how often the node status is measured; it is
	// patched when it changed. 0 means 10 s.
	StatusInterval time.Duration
	// StatusReportInterval is how often the node status is patched when
	// nothing changed, to refresh the conditions' heartbeat times. The
	// Lease, not the status, tells the control plane the node lives, so
	// this is long; 0 means 5 min.
	StatusReportInterval time.Duration

	// now and certCheckInterval let tests move the certificate's clock:
	// the rotation compares now() (default time.Now) with the certificate
	// every certCheckInterval (default 1 min).
	now               func() time.Time
	certCheckInterval time.Duration
	// plegRelist is how often the runtime is listed whole to catch what
	// its events missed: 0 means every 5 s, a negative duration never, so
	// that a test proves what the CRI's events do alone.
	plegRelist time.Duration
}

// RuntimeInfo tells the container runtime's name and version.
type RuntimeInfo interface {
	// RuntimeVersion returns them as the Node reports them, e.g.
	// "containerd://2.4.2".
	RuntimeVersion(ctx context.Context) (string, error)
}

// RuntimeInfoFunc is a RuntimeInfo as a function.
type RuntimeInfoFunc func(ctx context.Context) (string, error)

// RuntimeVersion returns f(ctx).
func (f RuntimeInfoFunc) RuntimeVersion(ctx context.Context) (string, error) { return f(ctx) }

// RuntimeStatus tells whether the container runtime can run pods; the
// CRI's Status call answers it.
type RuntimeStatus interface {
	// RuntimeStatus reports whether the runtime and its pod network are
	// ready, and if not, why, for a person to read.
	RuntimeStatus(ctx context.Context) (runtimeReady, networkReady bool, reason string, err error)
}

// RuntimeStatusFunc is a RuntimeStatus as a function.
type RuntimeStatusFunc func(ctx context.Context) (runtimeReady, networkReady bool, reason string, err error)

// RuntimeStatus returns f(ctx).
func (f RuntimeStatusFunc) RuntimeStatus(ctx context.Context) (bool, bool, string, error) {
	return f(ctx)
}

func (c *Config) setDefaults() {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.LeaseInterval == 0 {
		c.LeaseInterval = 10 * time.Second
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = 10 * time.Second
	}
	if c.StatusReportInterval == 0 {
		c.StatusReportInterval = 5 * time.Minute
	}
	if c.PodResync == 0 {
		c.PodResync = 10 * time.Second
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.certCheckInterval == 0 {
		c.certCheckInterval = time.Minute
	}
}

func (c *Config) check() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("no node name"))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("no state directory"))
	}
	if c.RuntimeInfo == nil || c.RuntimeStatus == nil {
		errs = append(errs, errors.New("no runtime info or status"))
	}
	return errors.Join(errs...)
}

// requestTimeout bounds each call to the API server.
const requestTimeout = 10 * time.Second

// Run joins the node to the cluster and keeps it there until ctx ends;
// then it returns nil once everything it started has stopped. What fails
// on the way — the API server unreachable, a certificate not yet approved —
// is logged and retried with backoff; Run returns an error only for a
// Config that cannot work.
func Run(ctx context.Context, cfg Config) error {
	k, err := newKubelet(cfg)
	if err != nil {
		return err
	}
	k.run(ctx)
	return nil
}

// kubelet is one run of Run.
type kubelet struct {
	cfg     Config
	log     *slog.Logger
	creds   *credentials
	client  kubernetes.Interface // authenticates as the node once creds.init succeeded
	host    hostInfo
	metrics *metrics
}

func newKubelet(cfg Config) (*kubelet, error) {
	cfg.setDefaults()
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("kubelet config: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("kubelet state: %w", err)
	}
	log := cfg.Log.With("node", cfg.NodeName)
	creds, err := newCredentials(credentialsConfig{
		cluster:  &cfg.Cluster,
		nodeName: cfg.NodeName,
		file:     filepath.Join(cfg.Dir, "pki", "client.pem"),
		agent:    "cairn-agent/" + cfg.Version,
		now:      cfg.now,
		check:    cfg.certCheckInterval,
		log:      log,
	})
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(creds.restConfig())
	if err != nil {
		return nil, fmt.Errorf("node client: %w", err)
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("kubelet metrics: %w", err)
	}
	return &kubelet{cfg: cfg, log: log, creds: creds, client: client, host: readHostInfo(cfg.NodeName, log), metrics: m}, nil
}

func (k *kubelet) run(ctx context.Context) {
	joinBackoff := newBackoff(time.Second, 30*time.Second)
	if retry(ctx, k.log, "get the node's credentials", joinBackoff, k.creds.init) != nil {
		return
	}
	var node *corev1.Node
	err := retry(ctx, k.log, "register the Node", joinBackoff, func(ctx context.Context) (err error) {
		node, err = k.register(ctx)
		return err
	})
	if err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { k.renewLease(ctx, node) })
	if k.cfg.OnJoined != nil {
		wg.Go(func() { k.cfg.OnJoined(ctx, k.client, node) })
	}
	wg.Go(func() { k.reportStatus(ctx) })
	if k.cfg.Pods != nil {
		wg.Go(func() { k.syncPods(ctx, node) })
	}
	if k.creds.rotates() {
		wg.Go(func() { k.creds.rotate(ctx, k.client) })
	}
	wg.Wait()
}
