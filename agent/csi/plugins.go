// Package csi is the node's side of the Container Storage Interface, as
// the kubelet does it: CSI drivers deployed as pods register through the
// kubelet's plugin registration (a socket in Config.RegistryDir that
// answers GetInfo, which the upstream node-driver-registrar sidecar
// serves), the node reports them in its CSINode object, and it mounts the
// volumes of its pods through them: NodeStageVolume once per volume on
// the node when the driver stages, NodePublishVolume once per pod, and
// back (NodeUnpublishVolume, then NodeUnstageVolume once no pod uses the
// volume) when the pods go. Raw block volumes are published as device
// nodes for the pods' volumeDevices, and claims the cluster grew are grown
// on the node (NodeExpandVolume, Expand).
//
//	p := csi.New(csi.Config{Dir: "/var/lib/kubelet", NodeName: "node-1"})
//	go p.Run(ctx)                  // watches plugins_registry/
//	go p.SyncCSINode(ctx, client)  // once joined: the CSINode, topology labels
//	path, fsGroup, err := p.SetUp(ctx, client, pod, &pod.Spec.Volumes[0])
//
// What a volume was mounted with is kept next to its mount, in
// vol_data.json, as the kubelet keeps it, so that a restarted agent
// unmounts the volumes of the pods that went while it was away.
package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Config is what New needs.
type Config struct {
	// Dir is the kubelet directory, /var/lib/kubelet on a node, where
	// drivers expect it: plugins_registry/ holds the registration sockets,
	// plugins/kubernetes.io/csi/ the volumes staged on the node, and
	// pods/<uid>/volumes/kubernetes.io~csi/ the ones published for a pod.
	Dir string
	// NodeName is the Node's name, in the CSINode's and the
	// VolumeAttachments' names.
	NodeName string
	// CallTimeout bounds each call to a driver; 0 means 2 min, the
	// kubelet's for mounts.
	CallTimeout time.Duration
	// Log receives what happens; nil means slog.Default().
	Log *slog.Logger
	// Metrics, if set, gets the latency of the calls to the drivers, by
	// driver, method and gRPC code, as the kubelet's
	// csi_operations_seconds.
	Metrics prometheus.Registerer

	// rescan is how often Run lists the registry besides its events: 0
	// means 5 s.
	rescan time.Duration
}

// Plugins are the CSI drivers registered on the node. Its methods may be
// called from many goroutines.
type Plugins struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	drivers map[string]*driver     // by name
	sockets map[string]socket      // registration sockets seen, by path
	changed chan struct{}          // a driver came or went; capacity 1
	inUse   map[string]int         // volumes being set up, by unique name
	locks   map[string]*sync.Mutex // one stage or unstage at a time, by unique name

	calls *prometheus.HistogramVec
}

// socket is a registration socket as last seen: a new file at the same
// path (the registrar restarted) is registered again.
type socket struct {
	id     fileID
	driver string // registered as, "" if registration failed
	failed time.Time
}

type fileID struct{ dev, ino uint64 }

// New returns the plugins of cfg, none registered until Run finds them.
func New(cfg Config) (*Plugins, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 2 * time.Minute
	}
	if cfg.rescan == 0 {
		cfg.rescan = 5 * time.Second
	}
	calls := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "csi_operations_seconds",
		Help:    "Latency of the node's calls to CSI drivers, by driver, method and gRPC status code.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120},
	}, []string{"driver_name", "method_name", "grpc_status_code"})
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(calls); err != nil {
			return nil, fmt.Errorf("csi metrics: %w", err)
		}
	}
	return &Plugins{cfg: cfg, log: cfg.Log.With("component", "csi"), drivers: map[string]*driver{},
		sockets: map[string]socket{}, changed: make(chan struct{}, 1), inUse: map[string]int{},
		locks: map[string]*sync.Mutex{}, calls: calls}, nil
}

// observe counts a call to the driver that took from start and ended
// with err.
func (p *Plugins) observe(driver, method string, start time.Time, err error) {
	p.calls.WithLabelValues(driver, method, status.Code(err).String()).Observe(time.Since(start).Seconds())
}

// RegistryDir is where drivers' registrars put their sockets.
func (p *Plugins) RegistryDir() string { return filepath.Join(p.cfg.Dir, "plugins_registry") }

// Run registers the drivers whose sockets are in the registry directory,
// as they come, and forgets those whose socket goes, until ctx ends.
func (p *Plugins) Run(ctx context.Context) error {
	dir := p.RegistryDir()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("plugin registry: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch the plugin registry: %w", err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	tick := time.NewTicker(p.cfg.rescan)
	defer tick.Stop()
	defer p.closeAll()
	for {
		p.scan(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-w.Events:
		case err := <-w.Errors:
			p.log.Warn("watch the plugin registry", "err", err)
		case <-tick.C:
		}
	}
}

// retryFailed is how long a socket whose registration failed waits for
// the next try.
const retryFailed = 5 * time.Second

// scan registers the new sockets of the registry and forgets the drivers
// whose socket is gone.
func (p *Plugins) scan(ctx context.Context) {
	ents, err := os.ReadDir(p.RegistryDir())
	if err != nil {
		p.log.Warn("read the plugin registry", "err", err)
		return
	}
	seen := map[string]fileID{}
	for _, e := range ents {
		if e.Type()&fs.ModeSocket == 0 || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(p.RegistryDir(), e.Name())
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			continue
		}
		seen[path] = fileID{st.Dev, st.Ino}
	}
	p.mu.Lock()
	var gone []string
	for path, s := range p.sockets {
		if id, ok := seen[path]; !ok || id != s.id {
			gone = append(gone, path)
		}
	}
	p.mu.Unlock()
	for _, path := range gone {
		p.deregister(path)
	}
	for path, id := range seen {
		p.mu.Lock()
		s, known := p.sockets[path]
		p.mu.Unlock()
		if known && (s.driver != "" || time.Since(s.failed) < retryFailed) {
			continue
		}
		name, err := p.register(ctx, path)
		s = socket{id: id, driver: name}
		if err != nil {
			s.failed = time.Now()
			p.log.Warn("CSI driver not registered", "socket", path, "err", err)
		}
		p.mu.Lock()
		p.sockets[path] = s
		p.mu.Unlock()
	}
}

// register asks the registration socket at path for its plugin, and
// registers it if it is a CSI driver whose node service answers; it tells
// the registrar how it went, and returns the driver's name.
func (p *Plugins) register(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return "", fmt.Errorf("GetInfo: %w", err)
	}
	d, err := p.registerDriver(ctx, info)
	status := &registerapi.RegistrationStatus{PluginRegistered: err == nil}
	if err != nil {
		status.Error = err.Error()
	}
	if _, nerr := reg.NotifyRegistrationStatus(ctx, status); nerr != nil {
		p.log.Warn("tell the registrar", "socket", path, "err", nerr)
	}
	if err != nil {
		return "", fmt.Errorf("plugin %q: %w", info.Name, err)
	}
	return d.name, nil
}

// registerDriver checks the plugin of info and, when it is a CSI driver
// of a version this node speaks, connects to its node service and keeps
// it, in place of one of the same name.
func (p *Plugins) registerDriver(ctx context.Context, info *registerapi.PluginInfo) (*driver, error) {
	if info.Type != registerapi.CSIPlugin {
		return nil, fmt.Errorf("type %q is not %s", info.Type, registerapi.CSIPlugin)
	}
	if info.Name == "" {
		return nil, errors.New("no name")
	}
	if !slices.ContainsFunc(info.SupportedVersions, func(v string) bool { return strings.HasPrefix(strings.TrimPrefix(v, "v"), "1.") }) {
		return nil, fmt.Errorf("versions %v: this node speaks CSI 1.x", info.SupportedVersions)
	}
	d, err := dial(ctx, info.Name, info.Endpoint)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	old := p.drivers[d.name]
	p.drivers[d.name] = d
	p.mu.Unlock()
	if old != nil {
		old.conn.Close()
	}
	p.notify()
	p.log.Info("registered CSI driver", "driver", d.name, "endpoint", d.endpoint, "nodeID", d.nodeID, "stages", d.stages, "topology", d.topology)
	return d, nil
}

// deregister forgets the socket at path and its driver, unless another
// socket registered that driver since.
func (p *Plugins) deregister(path string) {
	p.mu.Lock()
	s := p.sockets[path]
	delete(p.sockets, path)
	d := p.drivers[s.driver]
	if d != nil && slices.ContainsFunc(slices.Collect(maps.Values(p.sockets)), func(o socket) bool { return o.driver == s.driver }) {
		d = nil
	}
	if d != nil {
		delete(p.drivers, s.driver)
	}
	p.mu.Unlock()
	if d != nil {
		d.conn.Close()
		p.notify()
		p.log.Info("deregistered CSI driver: its socket is gone", "driver", d.name, "socket", path)
	}
}

func (p *Plugins) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, d := range p.drivers {
		d.conn.Close()
		delete(p.drivers, name)
	}
	clear(p.sockets)
}

func (p *Plugins) notify() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// driverNotFound is the kubelet's words for a volume of a driver that
// did not register.
func driverNotFound(name string) error {
	return fmt.Errorf("driver name %s not found in the list of registered CSI drivers", name)
}

// driver returns the registered driver name.
func (p *Plugins) driver(name string) (*driver, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.drivers[name]
	if d == nil {
		return nil, driverNotFound(name)
	}
	return d, nil
}

// Drivers returns the registered drivers' names, sorted.
func (p *Plugins) Drivers() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.drivers))
}

// driver is a registered CSI driver: its node service and what it said
// of the node.
type driver struct {
	name, endpoint string
	conn           *grpc.ClientConn
	node           csipb.NodeClient
	nodeID         string
	topology       map[string]string
	maxVolumes     int64
	stages         bool // STAGE_UNSTAGE_VOLUME
	stats          bool // GET_VOLUME_STATS
	expands        bool // EXPAND_VOLUME
}

// dial connects to the node service of the driver name at endpoint (a
// socket's path) and asks it about the node.
func dial(ctx context.Context, name, endpoint string) (*driver, error) {
	target := endpoint
	if !strings.HasPrefix(target, "unix:") {
		target = "unix:" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", endpoint, err)
	}
	d := &driver{name: name, endpoint: endpoint, conn: conn, node: csipb.NewNodeClient(conn)}
	info, err := d.node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("NodeGetInfo: %w", err)
	}
	if info.NodeId == "" {
		conn.Close()
		return nil, errors.New("NodeGetInfo: no node ID")
	}
	d.nodeID, d.maxVolumes = info.NodeId, info.MaxVolumesPerNode
	if t := info.AccessibleTopology; t != nil {
		d.topology = t.Segments
	}
	caps, err := d.node.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("NodeGetCapabilities: %w", err)
	}
	for _, c := range caps.Capabilities {
		switch c.GetRpc().GetType() {
		case csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME:
			d.stages = true
		case csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS:
			d.stats = true
		case csipb.NodeServiceCapability_RPC_EXPAND_VOLUME:
			d.expands = true
		}
	}
	return d, nil
}
