// Package containerdconfig writes containerd's configuration: its root and
// state, the CNI directories, the pinned sandbox image, and one hosts.toml
// per registry of the machine config (mirrors, plain HTTP, TLS
// verification), read by containerd's CRI and by init's own pulls. The node
// and the host tests run containerd with the same config, only the paths
// differ.
package containerdconfig

import (
	"fmt"
	"path"
	"strconv"

	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/machineconfig"
)

// Paths are where containerd keeps things and finds its plugins.
type Paths struct {
	Root, State, Socket   string
	HostsDir              string // certs.d: one directory per registry host
	CNIBinDir, CNIConfDir string
}

// Node holds the paths on a Cairn node.
var Node = Paths{
	Root:       layout.ContainerdRoot,
	State:      layout.ContainerdState,
	Socket:     layout.ContainerdSocket,
	HostsDir:   layout.RegistryHostsDir,
	CNIBinDir:  layout.CNIBinDir,
	CNIConfDir: layout.CNIConfDir,
}

// Files returns the node's containerd config files by absolute path.
func Files(cfg *machineconfig.Config) map[string][]byte {
	files := map[string][]byte{layout.ContainerdConfig: []byte(Config(Node, false))}
	for _, r := range cfg.Containerd.Registries {
		files[path.Join(Node.HostsDir, r.Host, "hosts.toml")] = []byte(hosts(r))
	}
	return files
}

// Config is containerd's config.toml for paths p. restrictOOMScoreAdj is
// for hosts where root lacks CAP_SYS_RESOURCE and cannot lower OOM scores.
//
// Plugins that would write outside p (NRI, the opt directory, the image
// verifier) are off: Cairn uses none of them and its root is read-only.
// Pod network namespaces live under the state directory.
func Config(p Paths, restrictOOMScoreAdj bool) string {
	q := strconv.Quote
	restrict := ""
	if restrictOOMScoreAdj {
		restrict = "  restrict_oom_score_adj = true\n"
	}
	return fmt.Sprintf(`# Written by Cairn from the machine config; changes are lost at boot.
version = 3
root = %s
state = %s
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt", "io.containerd.image-verifier.v1.bindir"]

[grpc]
  address = %s

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %s
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %s

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
%s  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%s]
    conf_dir = %s
    max_conf_num = 1
`, q(p.Root), q(p.State), q(p.Socket), q(layout.SandboxImage), q(p.HostsDir), restrict, q(p.CNIBinDir), q(p.CNIConfDir))
}
