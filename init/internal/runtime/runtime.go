// Package runtime writes containerd's configuration from the machine config:
// its root and state under /var and /run, the CNI directories, the pinned
// sandbox image, and one hosts.toml per configured registry (mirrors, plain
// HTTP, TLS verification), read by containerd's CRI and by init's own pulls.
package runtime

import (
	"fmt"
	"net/url"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/machineconfig"
)

// Paths on the node.
const (
	Root       = "/var/lib/containerd"
	State      = "/run/containerd"
	Socket     = State + "/containerd.sock"
	ConfigPath = "/etc/containerd/config.toml"
	HostsDir   = "/etc/containerd/certs.d"
	CNIBinDir  = "/opt/cni/bin"
	CNIConfDir = "/etc/cni/net.d"
)

// Files returns containerd's config files by absolute path.
func Files(cfg *machineconfig.Config) map[string][]byte {
	files := map[string][]byte{ConfigPath: []byte(config())}
	for _, r := range cfg.Containerd.Registries {
		files[path.Join(HostsDir, r.Host, "hosts.toml")] = []byte(hosts(r))
	}
	return files
}

func config() string {
	q := strconv.Quote
	return fmt.Sprintf(`# Written by Cairn's init from the machine config; changes are lost at boot.
version = 3
root = %s
state = %s

[grpc]
  address = %s

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %s
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %s

[plugins."io.containerd.cri.v1.runtime"]
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%s]
    conf_dir = %s
`, q(Root), q(State), q(Socket), q(layout.SandboxImage), q(HostsDir), q(CNIBinDir), q(CNIConfDir))
}

func hosts(r machineconfig.Registry) string {
	q := strconv.Quote
	var b strings.Builder
	b.WriteString("# Written by Cairn's init from the machine config.\n")
	// The registry itself is the server, tried after the mirrors; an
	// endpoint naming the registry's own host (e.g. http:// for a plain
	// HTTP registry) says how to reach it.
	server := "https://" + r.Host
	var mirrors []string
	for _, e := range r.Endpoints {
		if u, err := url.Parse(e); err == nil && u.Host == r.Host {
			server = e
		} else {
			mirrors = append(mirrors, e)
		}
	}
	fmt.Fprintf(&b, "server = %s\n", q(server))
	if r.InsecureSkipVerify {
		b.WriteString("skip_verify = true\n")
	}
	// Mirrors are tried in the order of their tables.
	for _, e := range mirrors {
		fmt.Fprintf(&b, "\n[host.%s]\n  capabilities = [\"pull\", \"resolve\"]\n", q(e))
		if r.InsecureSkipVerify {
			b.WriteString("  skip_verify = true\n")
		}
	}
	return b.String()
}

// SortedPaths lists the keys of files in order, for stable writes and logs.
func SortedPaths(files map[string][]byte) []string {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}
