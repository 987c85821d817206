// Command cairn-agent is the node agent of Cairn. It serves the management
// API over mutual TLS and asks init, over its control socket, for what only
// PID 1 may do (reboot, shutdown). When the machine config has a cluster
// section, it also joins the node to that Kubernetes cluster (the kubelet
// part); that never holds up or stops the management API.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/cairn-os/cairn/agent/api"
	"github.com/cairn-os/cairn/agent/kubelet"
	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/proxy"
	"github.com/cairn-os/cairn/internal/backoff"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/internal/version"
	"github.com/cairn-os/cairn/machineconfig"
)

func main() {
	configPath := flag.String("config", layout.MachineConfig, "machine config")
	initSocket := flag.String("init-socket", layout.InitSocket, "init's control socket")
	kubeletDir := flag.String("kubelet-dir", layout.KubeletDir, "the kubelet part's state: client certificate")
	paths := nodePaths{}
	flag.StringVar(&paths.criSocket, "cri-socket", layout.ContainerdSocket, "containerd's socket, for its CRI")
	flag.StringVar(&paths.podLogRoot, "pod-log-root", layout.PodLogRoot, "the pods' container logs, which the management API reads back")
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

// nodePaths are where the agent finds containerd and the CNI plugins and
// writes the pod network and the pods' logs. The flags' defaults are the
// node's paths; the pod startup benchmark (test/bench) runs the agent on a
// host beside a containerd of its own.
type nodePaths struct {
	criSocket, podLogRoot string
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
	srv, err := api.NewServer(cfg, initc, paths.podLogRoot)
	if err != nil {
		return err
	}
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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	reg := newRegistry()
	go func() {
		if err := serveMetrics(ctx, &cfg.Machine.API, reg, ml); err != nil {
			slog.Error("metrics not served", "err", err)
		}
	}()
	kubeletDone := startKubelet(ctx, cfg, kubeletDir, paths, reg)
	go func() {
		<-ctx.Done()
		slog.Info("stopping: finishing calls in flight")
		srv.GracefulStop()
	}()
	slog.Info("management API listening", "addr", addr)
	err = srv.Serve(l)
	stop()
	<-kubeletDone
	return err
}

// startKubelet runs the kubelet part if cfg has a cluster section, until
// ctx ends; the channel closes when it has stopped. It retries what fails
// on its own and only logs.
func startKubelet(ctx context.Context, cfg *machineconfig.Config, dir string, paths nodePaths, reg *prometheus.Registry) <-chan struct{} {
	done := make(chan struct{})
	if cfg.Cluster == nil {
		close(done)
		return done
	}
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
		err = kubelet.Run(ctx, kubelet.Config{
			NodeName:      cfg.Machine.Hostname,
			Cluster:       *cfg.Cluster,
			Dir:           dir,
			RuntimeInfo:   rt,
			RuntimeStatus: rt,
			Pods:          kubelet.NewPodConfig(cfg.Cluster, rt, paths.podLogRoot),
			OnJoined: func(ctx context.Context, client kubernetes.Interface, node *corev1.Node) {
				var wg sync.WaitGroup
				wg.Go(func() { writePodNetwork(ctx, client, node, paths) })
				runProxy(ctx, cfg.Cluster, client, node, reg)
				wg.Wait()
			},
			Metrics: reg,
			Version: version.Version,
			Log:     slog.Default().With("component", "kubelet"),
		})
		if err != nil {
			slog.Error("kubelet part not started", "err", err)
		}
	}()
	return done
}

// runProxy programs the node's Services into nftables with the node's own
// credentials until ctx ends, restarting the proxier if it fails.
func runProxy(ctx context.Context, cluster *machineconfig.Cluster, client kubernetes.Interface, node *corev1.Node, reg *prometheus.Registry) {
	cfg, err := proxyConfig(cluster, node)
	if err != nil {
		slog.Error("Service dataplane not started", "err", err)
		return
	}
	cfg.Logger = slog.Default().With("component", "proxy")
	b := backoff.Backoff{Initial: time.Second, Max: 30 * time.Second, Jitter: 0.2}
	for {
		p := proxy.New(cfg, client)
		reg.MustRegister(p) // a new proxier's metrics start over
		err := p.Run(ctx)
		reg.Unregister(p)
		if ctx.Err() != nil {
			return
		}
		delay := b.Next()
		slog.Error("Service dataplane stopped, restarting", "err", err, "in", delay.Round(time.Millisecond))
		if backoff.Sleep(ctx, backoff.RealClock, delay) != nil {
			return
		}
	}
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
