// Command proxyagent runs cairn-agent's Service proxier alone, as a
// process of its own, for the Service dataplane benchmark (test/bench):
// the same proxy.Run on shared informers of Services and EndpointSlices
// that cairn-agent runs, in the network namespace it is started in, with
// the node's name, addresses and the cluster's pod networks given here.
// The benchmark reads its CPU time and memory from /proc like
// kube-proxy's.
//
//	ip netns exec bench proxyagent -kubeconfig admin.kubeconfig \
//		-node-name bench-node -node-ip 10.200.0.1 -cluster-cidr 10.64.0.0/10
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/agent/proxy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the proxier's user")
	nodeName := flag.String("node-name", "", "the Node's name")
	nodeIP := flag.String("node-ip", "", "the node's address, which serves NodePorts")
	clusterCIDR := flag.String("cluster-cidr", "", "the pod network")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err := run(*kubeconfig, *nodeName, *nodeIP, *clusterCIDR); err != nil {
		slog.Error("proxyagent failed", "err", err)
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, nodeIP, clusterCIDR string) error {
	if kubeconfig == "" || nodeName == "" {
		return errors.New("-kubeconfig and -node-name are required")
	}
	cfg := proxy.Config{NodeName: nodeName, Logger: slog.Default().With("component", "proxy")}
	if nodeIP != "" {
		a, err := netip.ParseAddr(nodeIP)
		if err != nil {
			return err
		}
		cfg.NodeIPs = []netip.Addr{a}
	}
	if clusterCIDR != "" {
		p, err := netip.ParsePrefix(clusterCIDR)
		if err != nil {
			return err
		}
		cfg.ClusterCIDRs = []netip.Prefix{p}
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	node.ClientSettings(rc) // the agent's
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	factory := node.NewInformers(client, nodeName) // the agent's

	svcs, slices := factory.Core().V1().Services(), factory.Discovery().V1().EndpointSlices()
	svcs.Informer()
	slices.Informer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	return proxy.New(cfg, client).Run(ctx, svcs, slices)
}
