package proxy

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"
)

// Config holds what the proxier needs to know about the node it runs on.
// Everything node-specific comes in here; the proxier reads nothing else
// from the host.
type Config struct {
	// NodeName is this node's Node object name: an endpoint whose
	// EndpointSlice nodeName equals it is local (traffic policy Local).
	NodeName string
	// Hostname is matched against the kubernetes.io/hostname topology of an
	// endpoint that has no nodeName (old EndpointSlice writers). Defaults to
	// NodeName.
	Hostname string
	// NodeIPs are the addresses on which NodePorts are served.
	NodeIPs []netip.Addr
	// ClusterCIDRs are the pod networks. Traffic to a ClusterIP from a source
	// outside them is masqueraded, so the reply comes back through this node
	// whichever node the endpoint is on; traffic from pods keeps its source.
	// Without a CIDR for a family, ClusterIP traffic of that family is not
	// masqueraded (as kube-proxy without a local-traffic detector), unless
	// MasqueradeAll is set.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all ClusterIP traffic.
	MasqueradeAll bool
	// MasqueradeMark is the packet-mark bit that asks for masquerade at
	// postrouting. Default 0x4000.
	MasqueradeMark uint32

	// MinSyncInterval is the least time between two syncs while changes
	// keep coming: a burst of changes is written one transaction per
	// interval, and once more when it has been quiet for 100ms. A change
	// after a quiet interval is written at once. Default 1s.
	MinSyncInterval time.Duration
	// ResyncPeriod is how often the whole table is compared with the kernel
	// and rewritten (a full sync). Default 15m.
	ResyncPeriod time.Duration

	// NetNS is the path of a network namespace (e.g. /run/netns/x) to
	// program instead of the current one; empty means the caller's.
	NetNS string
	// Table is the nftables table name, default "cairn".
	Table string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

const (
	defaultTable           = "cairn"
	defaultMasqueradeMark  = 0x4000
	defaultMinSyncInterval = time.Second
	defaultResyncPeriod    = 15 * time.Minute
)

func (c Config) withDefaults() Config {
	if c.Hostname == "" {
		c.Hostname = c.NodeName
	}
	if c.MasqueradeMark == 0 {
		c.MasqueradeMark = defaultMasqueradeMark
	}
	if c.MinSyncInterval == 0 {
		c.MinSyncInterval = defaultMinSyncInterval
	}
	if c.ResyncPeriod == 0 {
		c.ResyncPeriod = defaultResyncPeriod
	}
	if c.Table == "" {
		c.Table = defaultTable
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	if c.NodeName == "" {
		return fmt.Errorf("proxy config: NodeName is empty: set it to this node's Node name")
	}
	if c.MasqueradeMark&(c.MasqueradeMark-1) != 0 {
		return fmt.Errorf("proxy config: MasqueradeMark %#x is not a single bit", c.MasqueradeMark)
	}
	for _, p := range c.ClusterCIDRs {
		if !p.IsValid() {
			return fmt.Errorf("proxy config: invalid cluster CIDR %v", p)
		}
	}
	for _, a := range c.NodeIPs {
		if !a.IsValid() {
			return fmt.Errorf("proxy config: invalid node IP %v", a)
		}
	}
	return nil
}
