// Package node makes the machine a node of a Kubernetes cluster and keeps
// it one: it gets the node's credentials — a client certificate by TLS
// bootstrapping with a bootstrap token, stored and rotated before it
// expires, or the kubeconfig of the machine config —, registers the Node
// (or adopts an existing one), renews the node's Lease and reports the
// node's status: addresses, capacity, conditions. Everything it does after
// bootstrapping it does as the node itself, system:node:NAME, as the API
// server's Node authorizer expects.
//
// Once the node joined, Run publishes what the rest of the agent needs as
// a Member — the node's client, its Node as watched, one informer factory
// whose informers wait out API server outages — and runs the agent's
// Components beside each other, each restarted on its own when it fails:
//
//	err := node.Run(ctx, node.Config{
//		NodeName: cfg.Machine.Hostname, Cluster: *cfg.Cluster, Dir: "/var/lib/cairn/kubelet",
//		RuntimeInfo: cri, RuntimeStatus: cri, Version: version.Version,
//	}, []node.Component{
//		{Name: "proxy", Run: runProxy},
//	})
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/cairn-os/cairn/internal/backoff"
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
	// Dir holds the node's state: pki/ keeps the client certificate. The
	// filesystem it is on is the node's ephemeral storage.
	Dir string
	// RuntimeInfo and RuntimeStatus tell about the container runtime.
	RuntimeInfo   RuntimeInfo
	RuntimeStatus RuntimeStatus
	// ImageFS, if set, says where the runtime keeps its images, whose
	// filesystem's free space puts the node under DiskPressure too
	// (imagefs.available).
	ImageFS func(ctx context.Context) (string, error)
	// Version is Cairn's version.
	Version string
	// NodeIP, if valid, is the node's one InternalIP; otherwise the node
	// reports the addresses of its default-route links (host.Addresses).
	NodeIP netip.Addr
	// KubeletPort is where the kubelet server listens, reported in the
	// Node's daemonEndpoints for the API server to reach it; 0 reports
	// none.
	KubeletPort int
	// DeclaredFeatures are the node's features that the API server reads
	// from the Node (status.declaredFeatures) to know what the kubelet
	// server does, e.g. ExtendWebSocketsToKubelet.
	DeclaredFeatures []string
	// Thresholds are the hard eviction thresholds, below which the node
	// reports pressure; zero fields take DefaultThresholds'.
	Thresholds Thresholds
	// VolumesInUse, if set, lists the volumes mounted on the node, which
	// its status reports (status.volumesInUse) for the attach/detach
	// controller not to detach them.
	VolumesInUse func() []corev1.UniqueVolumeName
	// PodRoutes, if set, says whether the routes to the other nodes' pods
	// are in, and if not why: until they are, the Node's
	// NetworkUnavailable condition stays True.
	PodRoutes func() (ready bool, why string)
	// Log receives what happens, the membership's own lines with
	// component "node" and each component's with its name; nil means
	// slog.Default().
	Log *slog.Logger
	// Metrics, if set, gets the membership's Prometheus metrics: Lease
	// renewals.
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
}

// RuntimeInfo tells the container runtime's name and version.
type RuntimeInfo interface {
	// RuntimeVersion returns them as the Node reports them, e.g.
	// "containerd://2.4.2".
	RuntimeVersion(ctx context.Context) (string, error)
}

// RuntimeStatus tells whether the container runtime can run pods; the
// CRI's Status call answers it.
type RuntimeStatus interface {
	// RuntimeStatus reports whether the runtime and its pod network are
	// ready, and if not, why, for a person to read.
	RuntimeStatus(ctx context.Context) (runtimeReady, networkReady bool, reason string, err error)
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

// A Component is a part of the agent that runs while the node is a member
// of the cluster, beside the other components: the pod loop, the Service
// dataplane, the pod network writer. Run runs it until ctx ends, and
// then returns nil; a component whose work is done may return nil sooner.
// When it returns an error, it is started again, later after each
// failure (see retryBackoff).
type Component struct {
	// Name names the component in the logs.
	Name string
	Run  func(ctx context.Context, m *Member) error
}

// Run joins the node to the cluster and keeps it there until ctx ends,
// running components once it joined; then it returns nil once everything
// it started has stopped. What fails on the way — the API server
// unreachable, a certificate not yet approved — is logged and retried with
// backoff; Run returns an error only for a Config that cannot work.
func Run(ctx context.Context, cfg Config, components []Component) error {
	j, err := newJoiner(cfg)
	if err != nil {
		return err
	}
	j.run(ctx, components)
	return nil
}

// joiner is one run of Run.
type joiner struct {
	cfg     Config
	log     *slog.Logger
	creds   *credentials
	client  kubernetes.Interface // authenticates as the node once creds.init succeeded
	host    hostInfo
	metrics *metrics
	// statusChecks counts the measurements reportStatus compared with the
	// Node, which tells a test that a status write had its chances.
	statusChecks atomic.Uint64
}

func newJoiner(cfg Config) (*joiner, error) {
	cfg.setDefaults()
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("node state: %w", err)
	}
	log := cfg.Log.With("component", "node", "node", cfg.NodeName)
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
		return nil, fmt.Errorf("node metrics: %w", err)
	}
	return &joiner{cfg: cfg, log: log, creds: creds, client: client, host: readHostInfo(cfg.NodeName, log), metrics: m}, nil
}

func (j *joiner) run(ctx context.Context, components []Component) {
	joinBackoff := retryBackoff()
	if retry(ctx, j.log, "get the node's credentials", joinBackoff, j.creds.init) != nil {
		return
	}
	var node *corev1.Node
	err := retry(ctx, j.log, "register the Node", joinBackoff, func(ctx context.Context) (err error) {
		node, err = j.register(ctx)
		return err
	})
	if err != nil {
		return
	}
	m := newMember(j.client, node, j.clusterCA())
	var wg sync.WaitGroup
	wg.Go(func() { j.renewLease(ctx, node) })
	wg.Go(func() { j.reportStatus(ctx) })
	if j.creds.rotates() {
		wg.Go(func() { j.creds.rotate(ctx, j.client) })
	}
	// The informers are all made before the factory starts: Start runs
	// those it has.
	m.Informers.Start(ctx.Done())
	for _, c := range components {
		wg.Go(func() { runComponent(ctx, m, c, j.cfg.Log.With("component", c.Name), retryBackoff()) })
	}
	wg.Wait()
	m.Informers.Shutdown()
}

// clusterCA is the PEM CA that the node trusts for the API server, from
// the machine config or its kubeconfig.
func (j *joiner) clusterCA() []byte {
	if j.creds.kubeconfig != nil {
		return j.creds.kubeconfig.CAData
	}
	return []byte(j.cfg.Cluster.CA)
}

// retry calls f until it returns nil, logging each failure and waiting as
// b says; it returns ctx's error if ctx ends first.
func retry(ctx context.Context, log *slog.Logger, what string, b backoff.Backoff, f func(context.Context) error) error {
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := b.Next()
		log.Warn("cannot "+what+"; retrying", "err", err, "in", d.Round(time.Millisecond))
		if err := backoff.Sleep(ctx, backoff.RealClock, d); err != nil {
			return err
		}
	}
}

// retryBackoff is the delay before joining is tried again and before a
// component that failed is started again: from 1 s doubling up to 30 s,
// with up to a fifth more at random so that the nodes that lost the API
// server together do not come back in step.
func retryBackoff() backoff.Backoff {
	return backoff.Backoff{Initial: time.Second, Max: 30 * time.Second, Jitter: 0.2}
}

// runComponent runs c until ctx ends or c returns nil, starting it again
// after each error as b says. A run that lasted longer than b's longest
// delay starts the schedule over: that failure is a new one.
func runComponent(ctx context.Context, m *Member, c Component, log *slog.Logger, b backoff.Backoff) {
	clock := b.Clock
	if clock == nil {
		clock = backoff.RealClock
	}
	for {
		started := clock.Now()
		err := c.Run(ctx, m)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			log.Info("component done")
			return
		}
		if clock.Now().Sub(started) > b.Max {
			b.Reset()
		}
		d := b.Next()
		log.Error("component failed; restarting", "err", err, "in", d.Round(time.Millisecond))
		if backoff.Sleep(ctx, clock, d) != nil {
			return
		}
	}
}

// Member is what the node's components share once it joined.
type Member struct {
	// Name is the Node's name.
	Name string
	// Client authenticates as the node, system:node:NAME.
	Client kubernetes.Interface
	// Informers is the agent's one informer factory (see NewInformers),
	// started once the node joined and stopped once its components
	// returned. Its Pods are the node's, its Nodes the node's own. An
	// informer of another kind asked for after the start would not run:
	// add it to NewInformers.
	Informers informers.SharedInformerFactory
	// ClusterCA is the cluster CA's PEM certificate: it signed the API
	// server's serving certificate and its kubelet client certificate.
	ClusterCA []byte

	registered *corev1.Node
	nodes      cache.SharedIndexInformer
	nodeLister corelisters.NodeLister
}

func newMember(client kubernetes.Interface, registered *corev1.Node, ca []byte) *Member {
	f := NewInformers(client, registered.Name)
	nodes := f.Core().V1().Nodes()
	return &Member{Name: registered.Name, Client: client, Informers: f, ClusterCA: ca,
		registered: registered, nodes: nodes.Informer(), nodeLister: nodes.Lister()}
}

// Node returns the Node as last watched, or as registered until the watch
// listed it. Do not modify it: it is the cache's.
func (m *Member) Node() *corev1.Node {
	if n, err := m.nodeLister.Get(m.Name); err == nil {
		return n
	}
	return m.registered
}

// NodeChanged returns a channel that receives a value when the Node
// changed (changes in between are merged into one), until stop is called.
func (m *Member) NodeChanged() (changed <-chan struct{}, stop func(), err error) {
	ch := make(chan struct{}, 1)
	notify := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	reg, err := m.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	})
	if err != nil {
		return nil, nil, fmt.Errorf("watch the Node: %w", err)
	}
	return ch, func() { _ = m.nodes.RemoveEventHandler(reg) }, nil
}
