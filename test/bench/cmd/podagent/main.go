// Command podagent runs cairn-agent's kubelet part alone, as a process of
// its own, for the pod startup benchmark (test/bench): the same node.Run,
// kubelet.Run, pod worker and metrics that cairn-agent runs, on a given
// CRI socket, node name and cluster section, without the management API,
// init, the Service dataplane and the pod network config. The benchmark
// reads its CPU time and memory from /proc like the upstream kubelet's.
//
//	podagent -cri-socket /tmp/x/containerd.sock -node-name bench-agent \
//		-cluster cluster.json -dir /tmp/x/agent -log-root /tmp/x/pods
//
// With -cpuprofile, SIGUSR1 starts a CPU profile and SIGUSR2 writes it to
// that file, so that the benchmark profiles just the part it measures.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cairn-os/cairn/agent/kubelet"
	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/machineconfig"
)

func main() {
	socket := flag.String("cri-socket", layout.ContainerdSocket, "the container runtime's CRI socket")
	nodeName := flag.String("node-name", "", "the Node's name")
	clusterFile := flag.String("cluster", "", "JSON file of the machine config's cluster section (server, CA, bootstrap token or kubeconfig)")
	dir := flag.String("dir", "", "the kubelet part's state: client certificate")
	logRoot := flag.String("log-root", "", "the pods' log directories")
	cpuProfile := flag.String("cpuprofile", "", "CPU profile written between SIGUSR1 and SIGUSR2")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err := run(*socket, *nodeName, *clusterFile, *dir, *logRoot, *cpuProfile); err != nil {
		slog.Error("podagent failed", "err", err)
		os.Exit(1)
	}
}

func run(socket, nodeName, clusterFile, dir, logRoot, cpuProfile string) error {
	if nodeName == "" || clusterFile == "" || dir == "" || logRoot == "" {
		return errors.New("-node-name, -cluster, -dir and -log-root are required")
	}
	b, err := os.ReadFile(clusterFile)
	if err != nil {
		return err
	}
	var cluster machineconfig.Cluster
	if err := json.Unmarshal(b, &cluster); err != nil {
		return fmt.Errorf("%s: %w", clusterFile, err)
	}
	if cpuProfile != "" {
		go profileOnSignal(cpuProfile)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The metrics are recorded as in cairn-agent, though nothing reads
	// them here.
	reg := prometheus.NewRegistry()
	rt, err := cri.New(socket, cri.WithMetrics(reg))
	if err != nil {
		return err
	}
	defer rt.Close()
	podConfig := kubelet.NewPodConfig(&cluster, rt, logRoot)
	pods := node.Component{Name: "kubelet", Run: func(ctx context.Context, m *node.Member) error {
		return kubelet.Run(ctx, m, kubelet.Config{Dir: dir, RuntimeInfo: rt, Pods: podConfig, Metrics: reg,
			Log: slog.Default().With("component", "kubelet")})
	}}
	return node.Run(ctx, node.Config{
		NodeName:      nodeName,
		Cluster:       cluster,
		Dir:           dir,
		RuntimeInfo:   rt,
		RuntimeStatus: rt,
		Metrics:       reg,
		Version:       "bench",
	}, []node.Component{pods})
}

// profileOnSignal profiles the CPU from each SIGUSR1 to the next SIGUSR2
// into file.
func profileOnSignal(file string) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	var f *os.File
	for s := range sig {
		switch {
		case s == syscall.SIGUSR1 && f == nil:
			var err error
			if f, err = os.Create(file); err != nil {
				slog.Error("CPU profile", "err", err)
				continue
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				slog.Error("CPU profile", "err", err)
				f.Close()
				f = nil
			}
		case s == syscall.SIGUSR2 && f != nil:
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				slog.Error("CPU profile", "err", err)
			}
			f = nil
		}
	}
}
