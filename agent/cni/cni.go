// Package cni writes the node's pod network for containerd's CRI: one CNI
// network configuration list in the directory the CRI reads, with
//
//   - bridge: every pod's veth on one bridge, which is the pods' gateway;
//   - host-local: pod addresses from the Node's pod CIDRs, one range per IP
//     family, with a default route through the bridge;
//   - portmap: hostPort mappings, in nftables through Debian's nft, which
//     the image carries.
//
// The CRI also needs the loopback plugin, for each pod's lo; it runs that
// one itself. Write checks the list with libcni and runs each plugin
// (VERSION) from the node's plugin directory before it writes the file
// atomically: the CRI reports its network ready as soon as the file is
// there, so it must only appear complete and usable.
//
//	path, err := cni.Write(ctx, cni.Network{PodCIDRs: cidrs, BinDir: "/opt/cni/bin", ConfDir: "/etc/cni/net.d"})
package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"

	"github.com/cairn-os/cairn/internal/atomicfile"
)

// Names in the configuration that Write writes.
const (
	NetworkName   = "cairn"
	FileName      = "10-cairn.conflist"
	DefaultBridge = "cairn0"
	cniVersion    = "1.0.0"
)

// Network is the node's pod network.
type Network struct {
	// PodCIDRs are the Node's pod ranges (spec.podCIDRs), at most one per
	// IP family.
	PodCIDRs []netip.Prefix
	// BinDir holds the plugins; ConfDir is where the CRI reads networks.
	BinDir, ConfDir string
	// Bridge is the bridge's name; empty means DefaultBridge.
	Bridge string
	// MTU, if set, is the MTU of the bridge and the pods' links: less than
	// the node's when pod traffic to other nodes is tunnelled.
	MTU int
	// DataDir is where host-local records the addresses it gave; empty
	// means the plugin's default, /var/lib/cni/networks.
	DataDir string
}

// Conflist returns the network configuration list of n, as JSON.
func (n Network) Conflist() ([]byte, error) {
	if len(n.PodCIDRs) == 0 {
		return nil, errors.New("no pod CIDR")
	}
	var ranges [][]map[string]string
	var routes []map[string]string
	for _, p := range n.PodCIDRs {
		if !p.IsValid() || p != p.Masked() {
			return nil, fmt.Errorf("pod CIDR %s: not a network address", p)
		}
		ranges = append(ranges, []map[string]string{{"subnet": p.String()}})
		def := "0.0.0.0/0"
		if p.Addr().Is6() {
			def = "::/0"
		}
		routes = append(routes, map[string]string{"dst": def})
	}
	ipam := map[string]any{"type": "host-local", "ranges": ranges, "routes": routes}
	if n.DataDir != "" {
		ipam["dataDir"] = n.DataDir
	}
	bridge := n.Bridge
	if bridge == "" {
		bridge = DefaultBridge
	}
	br := map[string]any{
		"type":      "bridge",
		"bridge":    bridge,
		"isGateway": true,
		// A pod reaches itself through a Service: the packet goes back
		// out of the port it came in by.
		"hairpinMode": true,
		// No masquerade here: the bridge plugin would hide pod addresses
		// from pods on other nodes too. The agent's nftables table
		// masquerades only what leaves the cluster CIDRs (agent/proxy,
		// pod-egress).
		"ipMasq": false,
		"ipam":   ipam,
	}
	if n.MTU > 0 {
		br["mtu"] = n.MTU
	}
	return json.MarshalIndent(map[string]any{
		"cniVersion": cniVersion,
		"name":       NetworkName,
		"plugins": []map[string]any{
			br,
			{
				"type":         "portmap",
				"capabilities": map[string]bool{"portMappings": true},
				// Named, so that portmap does not probe for iptables,
				// which the node lacks.
				"backend": "nftables",
			},
		},
	}, "", "  ")
}

// Write checks n's configuration list against the plugins in n.BinDir and
// writes it into n.ConfDir, replacing the file whole; it returns the
// file's path.
func Write(ctx context.Context, n Network) (string, error) {
	raw, err := n.Conflist()
	if err != nil {
		return "", err
	}
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		return "", fmt.Errorf("pod network configuration: %w", err)
	}
	plugins := libcni.NewCNIConfig([]string{n.BinDir}, nil)
	if _, err := plugins.ValidateNetworkList(ctx, list); err != nil {
		return "", fmt.Errorf("pod network plugins in %s: %w", n.BinDir, err)
	}
	// Plugins that the list names only inside another's configuration, or
	// that the CRI runs on its own.
	for _, p := range []string{"host-local", "loopback"} {
		if _, err := plugins.GetVersionInfo(ctx, p); err != nil {
			return "", fmt.Errorf("pod network plugin %s in %s: %w", p, n.BinDir, err)
		}
	}
	path := filepath.Join(n.ConfDir, FileName)
	if err := atomicfile.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("write the pod network configuration: %w", err)
	}
	return path, nil
}
