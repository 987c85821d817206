// Package agent is cairn-agent, the node agent of Cairn: Main runs it, in
// the node binary (init) called by that name. It serves the management
// API over mutual TLS and asks init, over its control socket, for what
// only PID 1 may do (reboot, shutdown, applying a machine config). It runs
// on the config that init writes to /run/cairn, and follows the changes
// that init applies live to it. When the machine config has a cluster
// section, it also joins the node to that Kubernetes cluster (agent/node)
// and runs the node's components beside each other once it joined: the
// pod loop (agent/kubelet), the kubelet server on the kubelet's port
// (agent/kubelet/server: kubectl logs), the Service dataplane
// (agent/proxy), the pod network writer and the Node's labels from the
// config; that never holds up or stops the management API. The pod loop
// runs the machine config's static pods from the agent's start, joined or
// not, cluster section or not.
package agent

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/cairn-os/cairn/agent/api"
	"github.com/cairn-os/cairn/agent/csi"
	"github.com/cairn-os/cairn/agent/drain"
	"github.com/cairn-os/cairn/agent/kubelet"
	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/kubelet/server"
	"github.com/cairn-os/cairn/agent/kubelet/stats"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/agent/podroutes"
	"github.com/cairn-os/cairn/agent/proxy"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/internal/version"
	"github.com/cairn-os/cairn/machineconfig"
)

// Main runs the agent until it is signalled to stop, its flags read from
// os.Args.
func Main() {
	configPath := flag.String("config", layout.RunningConfig, "the machine config the node runs, which init writes")
	initSocket := flag.String("init-socket", layout.InitSocket, "init's control socket")
	kubeletDir := flag.String("kubelet-dir", layout.KubeletDir, "the kubelet part's state: client and serving certificates")
	paths := nodePaths{}
	flag.StringVar(&paths.shutdownMarker, "shutdown-marker", layout.ShutdownMarker, "the file init writes when the node shuts down: the pods end before the agent")
	flag.StringVar(&paths.kubeletRoot, "kubelet-root-dir", layout.KubeletRootDir, "the pods' volumes and the CSI drivers' sockets, where drivers expect them")
	flag.StringVar(&paths.criSocket, "cri-socket", layout.ContainerdSocket, "containerd's socket, for its CRI")
	flag.StringVar(&paths.podLogRoot, "pod-log-root", layout.PodLogRoot, "the pods' container logs, which the management API reads back")
	flag.StringVar(&paths.staticPodDir, "static-pod-dir", layout.StaticPodDir, "the static pods' manifests, which init writes from the machine config")
	flag.StringVar(&paths.cniBinDir, "cni-bin-dir", layout.CNIBinDir, "the CNI plugins")
	flag.StringVar(&paths.cniConfDir, "cni-conf-dir", layout.CNIConfDir, "where the pod network is written for containerd's CRI")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	// client-go logs through klog: the same structured log.
	klog.SetSlogLogger(slog.Default().With("component", "client-go"))
	if err := run(*configPath, *initSocket, *kubeletDir, paths); err != nil {
		slog.Error("cairn-agent failed", "err", err)
		os.Exit(1)
	}
}

// drainMarker, in the kubelet directory (EPHEMERAL, which an upgrade
// keeps), says that a drain cordoned the Node before a reboot.
const drainMarker = "drain.json"

// nodePaths are where the agent finds containerd and the CNI plugins and
// writes the pod network and the pods' logs. The flags' defaults are the
// node's paths; the pod startup benchmark (test/bench) runs the agent on a
// host beside a containerd of its own.
type nodePaths struct {
	kubeletRoot           string
	shutdownMarker        string
	criSocket, podLogRoot string
	staticPodDir          string
	cniBinDir, cniConfDir string
}

// run serves the management API and the metrics, and runs the kubelet
// part, until SIGTERM or SIGINT. Init need not be there: the API calls
// that go to it fail while it is not.
func run(configPath, initSocket, kubeletDir string, paths nodePaths) error {
	cfg, err := loadConfig(configPath)
	if err != nil {
		return err
	}
	initc, err := api.DialInit(initSocket)
	if err != nil {
		return err
	}
	defer initc.Close()
	creds, err := api.NewCredentials(&cfg.Machine.API)
	if err != nil {
		return err
	}
	// The drainer works once the node joined its cluster (a component).
	drainer := drain.New(filepath.Join(kubeletDir, drainMarker), slog.Default().With("component", "drain"))
	srv := api.NewServer(creds, initc, drainer, paths.podLogRoot)
	addr := fmt.Sprintf(":%d", cfg.Machine.API.Port)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	metricsAddr := fmt.Sprintf(":%d", cfg.Machine.API.MetricsPort)
	ml, err := net.Listen("tcp", metricsAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", metricsAddr, err)
	}
	signaled, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ending := &podsEnding{}
	go func() {
		<-signaled.Done()
		// The node shuts down: the pods end before everything else.
		if _, err := os.Stat(paths.shutdownMarker); err == nil {
			ending.run(ctx, cfg.Machine.Shutdown)
		}
		cancel()
	}()
	reg := newRegistry()
	go func() {
		if err := serveMetrics(ctx, creds, reg, ml); err != nil {
			slog.Error("metrics not served", "err", err)
		}
	}()
	go func() {
		if err := followAPICredentials(ctx, configPath, creds, cfg.Machine.API); err != nil {
			slog.Error("machine.api credentials no longer follow the running config", "err", err)
		}
	}()
	nodeDone := startNode(ctx, cfg, configPath, kubeletDir, paths, reg, drainer, ending)
	go func() {
		<-ctx.Done()
		slog.Info("stopping: finishing calls in flight")
		srv.GracefulStop()
	}()
	slog.Info("management API listening", "addr", addr)
	err = srv.Serve(l)
	stop()
	<-nodeDone
	return err
}

// evictionThresholds are the node's hard eviction thresholds that e sets,
// the others left to node.DefaultThresholds.
func evictionThresholds(e machineconfig.Eviction) node.Thresholds {
	return thresholdsOf(e.HardThresholds())
}

// softEviction is the node's soft eviction that e sets, none if it sets
// no soft threshold.
func softEviction(e machineconfig.Eviction) kubelet.SoftEviction {
	soft, grace, maxPodGrace := e.SoftThresholds()
	return kubelet.SoftEviction{Thresholds: thresholdsOf(soft), GracePeriods: grace, MaxPodGracePeriod: maxPodGrace}
}

// thresholdsOf are the thresholds of by, by signal; zero where unset.
func thresholdsOf(by map[string]uint64) node.Thresholds {
	return node.Thresholds{
		MemoryAvailable: by["memory.available"], NodefsAvailable: by["nodefs.available"], NodefsInodesFree: by["nodefs.inodesFree"],
		ImagefsAvailable: by["imagefs.available"], PIDAvailable: by["pid.available"],
	}
}

// podsEnding ends the pods when the node shuts down, once the pod loop
// runs.
type podsEnding struct {
	mu  sync.Mutex
	end func(ctx context.Context, grace, critical time.Duration)
}

func (p *podsEnding) set(end func(ctx context.Context, grace, critical time.Duration)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.end = end
}

// run ends the pods within the grace periods of s, if the pod loop runs.
func (p *podsEnding) run(ctx context.Context, s machineconfig.Shutdown) {
	p.mu.Lock()
	end := p.end
	p.mu.Unlock()
	if end == nil {
		return
	}
	grace, critical := s.Periods()
	end(ctx, grace, critical)
}

// startNode runs the static pods, joins the node to the cluster if cfg has a cluster section, and runs the node's components
// until ctx ends; the channel closes when it has stopped. It retries what
// fails on its own and only logs. configPath is cfg's file, which init
// rewrites when a config is applied live.
func startNode(ctx context.Context, cfg *machineconfig.Config, configPath, dir string, paths nodePaths, reg *prometheus.Registry, drainer *drain.Drainer, ending *podsEnding) <-chan struct{} {
	done := make(chan struct{})
	// The pod loop runs even with no static pods and no cluster: a config
	// applied live may add static pods.
	go func() {
		defer close(done)
		// The client connects lazily and again whenever containerd is
		// away: until it answers, the Node reports NotReady and pod syncs
		// fail and are retried.
		rt, err := cri.New(paths.criSocket, cri.WithMetrics(reg))
		if err != nil {
			slog.Error("kubelet part not started: CRI client", "err", err)
			return
		}
		defer rt.Close()
		// The probes' runs as the kubelet counts them, for the kubelet
		// server's /metrics/probes.
		probeReg := prometheus.NewRegistry()
		// The pod loop runs the static pods from now on, and the API's
		// once the node joined.
		cluster := cfg.Cluster
		if cluster == nil {
			cluster = &machineconfig.Cluster{} // static pods alone
		}
		// CSI drivers register from the boot, those of static pods too.
		plugins, err := csi.New(csi.Config{Dir: paths.kubeletRoot, NodeName: cfg.Machine.Hostname, Metrics: reg})
		if err != nil {
			slog.Error("kubelet part not started", "err", err)
			return
		}
		thresholds := evictionThresholds(cfg.Machine.Eviction)
		pods, err := kubelet.New(kubelet.Config{Dir: paths.kubeletRoot, RuntimeInfo: rt, Pods: kubelet.NewPodConfig(cluster, rt, paths.podLogRoot),
			NodeName: cfg.Machine.Hostname, StaticPodDir: paths.staticPodDir, Metrics: reg, ProbeMetrics: probeReg,
			CSI: plugins, Thresholds: thresholds, Soft: softEviction(cfg.Machine.Eviction), Log: slog.Default().With("component", "kubelet")})
		if err != nil {
			slog.Error("kubelet part not started", "err", err)
			return
		}
		ending.set(pods.Shutdown)
		var podsDone sync.WaitGroup
		podsDone.Go(func() {
			if err := plugins.Run(ctx); err != nil {
				slog.Error("CSI drivers cannot register", "err", err)
			}
		})
		podsDone.Go(func() { pods.Run(ctx) })
		defer podsDone.Wait()
		if cfg.Cluster == nil {
			<-ctx.Done()
			return
		}
		var serviceCIDRs []netip.Prefix
		for _, c := range cfg.Cluster.ServiceCIDRs {
			serviceCIDRs = append(serviceCIDRs, netip.MustParsePrefix(c)) // validated with the config
		}
		routes, err := podroutes.New(podroutes.Config{NodeName: cfg.Machine.Hostname, Mode: cfg.Cluster.PodNetwork.Mode,
			ServiceCIDRs: serviceCIDRs, Logger: slog.Default().With("component", "pod-routes")})
		if err != nil {
			slog.Error("kubelet part not started", "err", err)
			return
		}
		labels := &nodeLabels{path: configPath, applied: maps.Clone(cfg.Cluster.NodeLabels), log: slog.Default().With("component", "labels")}
		// The node's components: peers that run once the node joined,
		// each restarted on its own when it fails.
		components := []node.Component{
			{Name: "labels", Run: labels.run},
			{Name: "drain", Run: drainer.Run},
			{Name: "kubelet", Run: pods.Join},
			{Name: "csi", Run: func(ctx context.Context, m *node.Member) error { plugins.SyncCSINode(ctx, m.Client); return nil }},
			{Name: "proxy", Run: func(ctx context.Context, m *node.Member) error { return runProxy(ctx, cfg.Cluster, m, reg) }},
			{Name: "network-policy", Run: runPolicies},
			{Name: "pod-routes", Run: func(ctx context.Context, m *node.Member) error { return runPodRoutes(ctx, routes, m) }},
			{Name: "cni", Run: func(ctx context.Context, m *node.Member) error { return writePodNetwork(ctx, m, paths, routes.PodMTU) }},
			{Name: "kubelet-server", Run: func(ctx context.Context, m *node.Member) error {
				return runKubeletServer(ctx, cfg.Cluster, m, server.Config{Runtime: rt.Runtime, PodLogRoot: paths.podLogRoot,
					CertFile: filepath.Join(dir, layout.KubeletServingCert), Metrics: reg, ProbeMetrics: probeReg,
					Stats: stats.New(stats.Config{NodeName: m.Name, Runtime: rt.Runtime, Images: rt.Images, RootDir: paths.kubeletRoot, PodLogRoot: paths.podLogRoot,
						VolumeStats: plugins.VolumeStats})})
			}},
		}
		var nodeIP netip.Addr
		if cfg.Cluster.NodeIP != "" {
			nodeIP = netip.MustParseAddr(cfg.Cluster.NodeIP) // validated with the config
		}
		err = node.Run(ctx, node.Config{
			NodeName:      cfg.Machine.Hostname,
			Cluster:       *cfg.Cluster,
			Dir:           dir,
			RuntimeInfo:   rt,
			RuntimeStatus: rt,
			ImageFS:       func(ctx context.Context) (string, error) { return cri.ImageFilesystem(ctx, rt.Images) },
			Metrics:       reg,
			Version:       version.Version,
			NodeIP:        nodeIP,
			KubeletPort:   cfg.Cluster.KubeletPort,
			// What the kubelet server does (its streams), for the API
			// server to know.
			DeclaredFeatures: server.DeclaredFeatures,
			VolumesInUse:     plugins.InUse,
			PodRoutes:        routes.Ready,
			Thresholds:       thresholds,
		}, components)
		if err != nil {
			slog.Error("kubelet part not started", "err", err)
		}
	}()
	return done
}

// runKubeletServer serves the kubelet's port, for the API server's calls
// to the node (kubectl logs), with sc and the member's identity, until
// ctx ends.
func runKubeletServer(ctx context.Context, cluster *machineconfig.Cluster, m *node.Member, sc server.Config) error {
	addr := fmt.Sprintf(":%d", cluster.KubeletPort)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	sc.NodeName, sc.Client, sc.ClusterCA, sc.Node = m.Name, m.Client, m.ClusterCA, m
	sc.Pods = m.Informers.Core().V1().Pods().Lister()
	sc.Configz = server.KubeletConfig{
		Port: int32(cluster.KubeletPort), ClusterDomain: cluster.ClusterDomain, ClusterDNS: cluster.ClusterDNS,
		PodCIDR: cluster.PodCIDR,
		// containerd's runc is not told to use systemd, which the node
		// does not run: runc writes the cgroups itself.
		CgroupDriver: "cgroupfs",
	}
	sc.Log = slog.Default().With("component", "kubelet-server")
	return server.Serve(ctx, l, sc)
}

// runPodRoutes routes the other nodes' pod CIDRs, watching every Node,
// until ctx ends.
func runPodRoutes(ctx context.Context, r *podroutes.Router, m *node.Member) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	nodes := node.NodesInformer(m.Client)
	go nodes.Run(ctx.Done())
	return r.Run(ctx, m.Client, nodes)
}

// runPolicies enforces the cluster's NetworkPolicies for the node's pods
// until ctx ends.
func runPolicies(ctx context.Context, m *node.Member) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	policies, pods, namespaces := node.PolicyInformers(m.Client)
	for _, inf := range []cache.SharedIndexInformer{policies, pods, namespaces} {
		go inf.Run(ctx.Done())
	}
	e := proxy.NewPolicyEnforcer(proxy.PolicyConfig{NodeName: m.Name, Logger: slog.Default().With("component", "network-policy")}, m.Client)
	return e.Run(ctx, policies, pods, namespaces)
}

// runProxy programs the node's Services into nftables with the node's own
// credentials and informers until ctx ends.
func runProxy(ctx context.Context, cluster *machineconfig.Cluster, m *node.Member, reg *prometheus.Registry) error {
	cfg, err := proxyConfig(cluster, m.Node())
	if err != nil {
		return err
	}
	cfg.Logger = slog.Default().With("component", "proxy")
	p := proxy.New(cfg, m.Client)
	reg.MustRegister(p) // a new proxier's metrics start over
	defer reg.Unregister(p)
	return p.Run(ctx, m.Informers.Core().V1().Services(), m.Informers.Discovery().V1().EndpointSlices())
}

// proxyConfig is the proxier's view of this node: its name and addresses
// as registered, and the cluster's pod networks.
func proxyConfig(cluster *machineconfig.Cluster, node *corev1.Node) (proxy.Config, error) {
	cfg := proxy.Config{NodeName: node.Name, Hostname: node.Labels[corev1.LabelHostname]}
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			cfg.NodeIPs = append(cfg.NodeIPs, ip)
		}
	}
	for _, c := range cluster.ClusterCIDRs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			return cfg, fmt.Errorf("cluster.clusterCIDRs: %w", err)
		}
		cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, pfx)
	}
	return cfg, nil
}
