// Package podroutes routes the pod CIDRs of the cluster's other nodes from
// this one, so that a pod reaches every other pod by its own address, as
// the pod network model asks. It watches the Nodes and, for each other
// node's pod CIDR of each IP family, routes it
//
//   - host-gw: through the node's InternalIP, when the two nodes share a
//     network (the route's gateway is that address);
//   - vxlan: through a VXLAN device per family (cairn.vx4, cairn.vx6; VNI
//     1, UDP port 8472), when they do not: the route's gateway is the
//     other node's pod CIDR's first address, on-link on the device, with a
//     permanent neighbour entry giving it the other node's device address
//     and a forwarding entry sending that address to its InternalIP, as
//     flannel's vxlan backend does. Each device's hardware address is made
//     from its node's InternalIP, so no node has to publish it.
//
// The mode (machineconfig.PodNetwork) picks one for all nodes, or, auto,
// host-gw for the nodes on a shared network and vxlan for the others.
// Routes are added and removed as Nodes come and go; the routes it adds
// carry their own protocol number (Protocol), which is how it finds them
// again after a restart, and it touches no other route.
//
// A node whose pod CIDR overlaps this node's or another one's is refused
// (an Event on that Node says why), and the others are routed. Until the
// first sync has programmed every route, Ready says so, for the Node's
// NetworkUnavailable condition.
package podroutes

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/cairn-os/cairn/machineconfig"
)

// A route is one pod CIDR of another node, and how it is reached.
type route struct {
	node  string
	cidr  netip.Prefix
	via   netip.Addr // the node's InternalIP of the CIDR's family
	vxlan bool
}

// A refusal is a node whose pod CIDRs are not routed, and why.
type refusal struct {
	node *corev1.Node
	why  string
}

// self is what this node brings to the plan: its pod CIDRs and its
// InternalIPs, by family.
type self struct {
	cidrs []netip.Prefix
	addrs map[bool]netip.Addr // by Is6
}

// onLinkFunc says whether addr is on a network this node is on, so that
// it is reached without a gateway.
type onLinkFunc func(addr netip.Addr) (bool, error)

// plan works out the routes to the other nodes of nodes from this node
// (name), in mode, with the cluster's Service ranges services. Nodes are
// taken oldest first, so that of two that claim the same addresses the
// one that was there first is routed. A node with no pod CIDR, or with
// none of its InternalIPs of a CIDR's family yet, is left out without a
// refusal: it has not finished registering. This node's pod CIDR in a
// Service range is an error: it routes nothing until that is mended.
func plan(name, mode string, services []netip.Prefix, nodes []*corev1.Node, onLink onLinkFunc) (*self, []route, []refusal, error) {
	var me *corev1.Node
	for _, n := range nodes {
		if n.Name == name {
			me = n
		}
	}
	if me == nil {
		return nil, nil, nil, fmt.Errorf("Node %s not seen yet", name)
	}
	s := &self{addrs: internalIPs(me)}
	var err error
	if s.cidrs, err = PodCIDRs(me); err != nil {
		return nil, nil, nil, fmt.Errorf("Node %s: %w", name, err)
	}
	// taken holds the Service ranges and every pod CIDR accepted so far,
	// and whose it is.
	type claim struct {
		cidr  netip.Prefix
		owner string
	}
	var taken []claim
	for _, c := range services {
		taken = append(taken, claim{c, "the Service range"})
	}
	for _, c := range s.cidrs {
		for _, sv := range services {
			if c.Overlaps(sv) {
				return nil, nil, nil, fmt.Errorf("this Node's pod CIDR %s overlaps the Service range %s", c, sv)
			}
		}
		taken = append(taken, claim{c, "Node " + name})
	}
	others := slices.DeleteFunc(slices.Clone(nodes), func(n *corev1.Node) bool { return n.Name == name })
	slices.SortFunc(others, func(a, b *corev1.Node) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	var routes []route
	var refused []refusal
	for _, n := range others {
		rs, why, err := nodeRoutes(n, s, mode, onLink)
		if err != nil {
			return nil, nil, nil, err
		}
		for _, r := range rs {
			for _, t := range taken {
				if r.cidr.Overlaps(t.cidr) && why == "" {
					why = fmt.Sprintf("its pod CIDR %s overlaps %s of %s", r.cidr, t.cidr, t.owner)
				}
			}
		}
		if why != "" {
			refused = append(refused, refusal{n, why})
			continue
		}
		for _, r := range rs {
			taken = append(taken, claim{r.cidr, "Node " + n.Name})
		}
		routes = append(routes, rs...)
	}
	return s, routes, refused, nil
}

// nodeRoutes returns the routes to node n's pod CIDRs, or why it cannot
// be routed.
func nodeRoutes(n *corev1.Node, s *self, mode string, onLink onLinkFunc) ([]route, string, error) {
	cidrs, err := PodCIDRs(n)
	if err != nil {
		return nil, err.Error(), nil
	}
	addrs := internalIPs(n)
	var rs []route
	for _, c := range cidrs {
		six := c.Addr().Is6()
		via, ok := addrs[six]
		if !ok {
			continue // not reported yet
		}
		if via == s.addrs[six] {
			return nil, fmt.Sprintf("its InternalIP %s is this node's: its pod CIDR %s cannot be routed through it", via, c), nil
		}
		r := route{node: n.Name, cidr: c, via: via}
		switch mode {
		case machineconfig.PodNetworkVXLAN:
			r.vxlan = true
		default: // auto, host-gw
			near, err := onLink(via)
			if err != nil {
				return nil, "", fmt.Errorf("route to Node %s's InternalIP %s: %w", n.Name, via, err)
			}
			if !near && mode == machineconfig.PodNetworkHostGW {
				return nil, fmt.Sprintf("its InternalIP %s is not on a network this node is on: host-gw cannot route its pod CIDR %s (use cluster.podNetwork.mode vxlan or auto)", via, c), nil
			}
			r.vxlan = !near
		}
		if _, ok := s.addrs[six]; r.vxlan && !ok {
			return nil, fmt.Sprintf("this node has no InternalIP of its pod CIDR %s's family for a VXLAN tunnel", c), nil
		}
		rs = append(rs, r)
	}
	return rs, "", nil
}

// PodCIDRs returns the Node's pod ranges, each a network address.
func PodCIDRs(n *corev1.Node) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range n.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil || p != p.Masked() {
			return nil, fmt.Errorf("spec.podCIDRs: %q is not a network", c)
		}
		out = append(out, p)
	}
	return out, nil
}

// internalIPs returns the Node's first InternalIP of each family, by Is6.
func internalIPs(n *corev1.Node) map[bool]netip.Addr {
	m := map[bool]netip.Addr{}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		ip = ip.Unmap()
		if _, ok := m[ip.Is6()]; !ok {
			m[ip.Is6()] = ip
		}
	}
	return m
}
