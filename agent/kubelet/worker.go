package kubelet

import (
	"time"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/machineconfig"
)

// PodConfig is what the node runs its pods with. The pod worker itself
// (pods.Worker) is made from it once the node joined, as it reads and
// records through the API with the node's own credentials (see
// newPodWorker).
type PodConfig struct {
	// Runtime and Images are the CRI runtime's services.
	Runtime criv1.RuntimeServiceClient
	Images  criv1.ImageServiceClient
	// LogRoot holds the pods' container logs, /var/log/pods on a node.
	LogRoot string
	// ClusterDNS, if set, is the resolver of ClusterFirst pods.
	ClusterDNS *pods.ClusterDNS

	// volumeClock, if set, is the clock of the pods' volumes (token
	// expiry), which tests move.
	volumeClock func() time.Time
}

// NewPodConfig is the pod config of a node of cluster: it runs the
// node's pods through the CRI client rt and keeps their container logs
// under logRoot (/var/log/pods on a node).
func NewPodConfig(cluster *machineconfig.Cluster, rt *cri.Client, logRoot string) *PodConfig {
	c := &PodConfig{Runtime: rt.Runtime, Images: rt.Images, LogRoot: logRoot}
	if len(cluster.ClusterDNS) > 0 {
		c.ClusterDNS = &pods.ClusterDNS{Servers: cluster.ClusterDNS, Domain: cluster.ClusterDomain}
	}
	return c
}
