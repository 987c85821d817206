package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/agent/cni"
	"github.com/cairn-os/cairn/internal/backoff"
)

// writePodNetwork writes the pod network for containerd's CRI once the
// Node has its pod ranges — at registration from cluster.podCIDR, or soon
// after from kube-controller-manager's node IPAM —, retrying until it is
// written or ctx ends. Until then the CRI reports its network not ready,
// and so does the Node. The plugins are in paths.cniBinDir, the network is
// written to paths.cniConfDir.
func writePodNetwork(ctx context.Context, client kubernetes.Interface, node *corev1.Node, paths nodePaths) {
	log := slog.Default().With("component", "cni")
	b := backoff.Backoff{Initial: time.Second, Max: 10 * time.Second, Jitter: 0.2}
	for {
		cidrs, err := podCIDRs(node)
		if err == nil && len(cidrs) > 0 {
			var path string
			path, err = cni.Write(ctx, cni.Network{
				PodCIDRs: cidrs,
				BinDir:   paths.cniBinDir,
				ConfDir:  paths.cniConfDir,
			})
			if err == nil {
				log.Info("pod network written", "file", path, "podCIDRs", cidrs)
				return
			}
		}
		delay := b.Next()
		if err != nil {
			log.Error("pod network not written, retrying", "err", err, "in", delay.Round(time.Millisecond))
		} else {
			log.Info("waiting for the Node's pod CIDR", "in", delay.Round(time.Millisecond))
		}
		if backoff.Sleep(ctx, backoff.RealClock, delay) != nil {
			return
		}
		got, err := client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			log.Error("get the Node", "err", err)
			continue
		}
		node = got
	}
}

// podCIDRs returns the Node's pod ranges.
func podCIDRs(node *corev1.Node) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range node.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("Node spec.podCIDRs: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}
