package agent

import (
	"context"
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"

	"github.com/cairn-os/cairn/agent/cni"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/agent/podroutes"
)

// writePodNetwork writes the pod network for containerd's CRI once the
// Node has its pod ranges — at registration from cluster.podCIDR, or soon
// after from kube-controller-manager's node IPAM —, watching the Node
// until it has them or ctx ends; it returns nil once the network is
// written, an error when it could not be (the component is then started
// again). Until then the CRI reports its network not ready, and so does
// the Node. The plugins are in paths.cniBinDir, the network is written to
// paths.cniConfDir, with the MTU that podMTU gives for the Node.
func writePodNetwork(ctx context.Context, m *node.Member, paths nodePaths, podMTU func(*corev1.Node) (int, error)) error {
	log := slog.Default().With("component", "cni")
	changed, stop, err := m.NodeChanged()
	if err != nil {
		return err
	}
	defer stop()
	for waiting := false; ; waiting = true {
		cidrs, err := podroutes.PodCIDRs(m.Node())
		if err != nil {
			return fmt.Errorf("Node %s: %w", m.Name, err)
		}
		if len(cidrs) > 0 {
			mtu, err := podMTU(m.Node())
			if err != nil {
				return fmt.Errorf("the pods' MTU: %w", err)
			}
			path, err := cni.Write(ctx, cni.Network{PodCIDRs: cidrs, BinDir: paths.cniBinDir, ConfDir: paths.cniConfDir, MTU: mtu})
			if err != nil {
				return fmt.Errorf("write the pod network: %w", err)
			}
			log.Info("pod network written", "file", path, "podCIDRs", cidrs, "mtu", mtu)
			return nil
		}
		if !waiting {
			log.Info("waiting for the Node's pod CIDR")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
