package kubelet

import (
	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/machineconfig"
)

// NewPodWorker is the pod worker of a node of cluster: it runs the node's
// pods through the CRI client rt and keeps their container logs under
// logRoot (/var/log/pods on a node).
func NewPodWorker(cluster *machineconfig.Cluster, rt *cri.Client, logRoot string) *pods.Worker {
	w := &pods.Worker{Runtime: rt.Runtime, Images: rt.Images, LogRoot: logRoot}
	if len(cluster.ClusterDNS) > 0 {
		w.ClusterDNS = &pods.ClusterDNS{Servers: cluster.ClusterDNS, Domain: cluster.ClusterDomain}
	}
	return w
}
