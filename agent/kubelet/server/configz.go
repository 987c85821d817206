package server

import (
	"encoding/json"
	"net/http"
)

// KubeletConfig is what /configz shows: the settings the node runs with,
// under the names of the kubelet's KubeletConfiguration
// (kubelet.config.k8s.io/v1beta1), so that what reads a kubelet's
// /configz reads the node's. Only settings the node has are there.
type KubeletConfig struct {
	// Port is the kubelet server's port.
	Port int32 `json:"port"`
	// ClusterDomain and ClusterDNS are what the pods' resolv.conf names.
	ClusterDomain string   `json:"clusterDomain,omitempty"`
	ClusterDNS    []string `json:"clusterDNS,omitempty"`
	// PodCIDR is the machine config's pod range, if it has one.
	PodCIDR string `json:"podCIDR,omitempty"`
	// CgroupDriver is how the runtime places the containers' cgroups.
	CgroupDriver string `json:"cgroupDriver,omitempty"`
	// MaxPods is the Node's pod capacity and ServerTLSBootstrap whether
	// the serving certificate comes from the cluster: the server fills
	// them from the Node it serves.
	MaxPods            int32 `json:"maxPods,omitempty"`
	ServerTLSBootstrap bool  `json:"serverTLSBootstrap,omitempty"`
}

// configz answers GET /configz as the kubelet does:
// {"kubeletconfig": {...}}.
func (s *server) configz(w http.ResponseWriter, _ *http.Request) {
	c := s.cfg.Configz
	if s.cfg.Node != nil {
		c.ServerTLSBootstrap = true
		if pods, ok := s.cfg.Node.Node().Status.Capacity.Pods().AsInt64(); ok {
			c.MaxPods = int32(pods)
		}
	}
	b, err := json.Marshal(map[string]KubeletConfig{"kubeletconfig": c})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
