package podroutes

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Protocol is the routing protocol number of the routes this package adds
// (ip route shows "proto 202"): what tells them from everyone else's.
const Protocol netlink.RouteProtocol = 202

// The VXLAN tunnel, as flannel's vxlan backend sets it up, so that the
// numbers are familiar: VNI 1 on Linux's own VXLAN port.
const (
	vxlanID   = 1
	vxlanPort = 8472
)

// overhead is what VXLAN adds to a packet: the outer IP header, UDP (8),
// VXLAN (8) and the inner Ethernet header (14).
func overhead(six bool) int {
	if six {
		return 40 + 30
	}
	return 20 + 30
}

// deviceName is the VXLAN device of a family.
func deviceName(six bool) string {
	if six {
		return "cairn.vx6"
	}
	return "cairn.vx4"
}

// deviceMAC is the hardware address of the VXLAN device of the node with
// InternalIP addr: 0a:58 and the IPv4 address (as the CNI plugins make
// addresses from IPs), or 0a:59 and four bytes of the IPv6 address's
// SHA-256. Locally administered and unicast.
func deviceMAC(addr netip.Addr) net.HardwareAddr {
	if addr.Is4() {
		b := addr.As4()
		return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
	}
	b := addr.As16()
	h := sha256.Sum256(b[:])
	return net.HardwareAddr{0x0a, 0x59, h[0], h[1], h[2], h[3]}
}

func family(six bool) int {
	if six {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// kernel programs routes into one network namespace.
type kernel struct {
	h *netlink.Handle
}

// onLink says whether the kernel reaches addr without a gateway, on a
// link other than loopback.
func (k kernel) onLink(addr netip.Addr) (bool, error) {
	rs, err := k.h.RouteGet(addr.AsSlice())
	if err != nil {
		return false, err
	}
	return len(rs) > 0 && rs[0].Gw == nil && rs[0].Type == unix.RTN_UNICAST, nil
}

// errNoLink is linkMTU's error when no link holds the address.
var errNoLink = errors.New("no link holds the address")

// linkMTU returns the MTU of the link that holds addr.
func (k kernel) linkMTU(addr netip.Addr) (int, error) {
	as, err := k.h.AddrList(nil, family(addr.Is6()))
	if err != nil {
		return 0, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			l, err := k.h.LinkByIndex(a.LinkIndex)
			if err != nil {
				return 0, fmt.Errorf("link of %s: %w", addr, err)
			}
			return l.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("%w %s", errNoLink, addr)
}

// apply makes the namespace's routes to other nodes' pod CIDRs those of
// rs, with s the node's own: it sets up or removes each family's VXLAN
// device, replaces the routes, neighbour and forwarding entries rs needs
// and deletes the others it made.
func (k kernel) apply(s *self, rs []route) error {
	var errs []error
	for _, six := range []bool{false, true} {
		var fam []route
		for _, r := range rs {
			if r.cidr.Addr().Is6() == six {
				fam = append(fam, r)
			}
		}
		if err := k.applyFamily(s, six, fam); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (k kernel) applyFamily(s *self, six bool, rs []route) error {
	var tunnelled []route
	for _, r := range rs {
		if r.vxlan {
			tunnelled = append(tunnelled, r)
		}
	}
	dev, err := k.device(s, six, len(tunnelled) > 0)
	if err != nil {
		return err
	}
	want := map[netip.Prefix]bool{}
	for _, r := range rs {
		want[r.cidr] = true
		nr := &netlink.Route{Dst: ipNet(r.cidr), Gw: r.via.AsSlice(), Protocol: Protocol}
		if r.vxlan {
			gw := r.cidr.Addr()
			nr.Gw, nr.LinkIndex, nr.Flags = gw.AsSlice(), dev.Attrs().Index, int(netlink.FLAG_ONLINK)
			mac := deviceMAC(r.via)
			if err := k.h.NeighSet(&netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: family(six), State: netlink.NUD_PERMANENT,
				IP: gw.AsSlice(), HardwareAddr: mac}); err != nil {
				return fmt.Errorf("neighbour %s for Node %s: %w", gw, r.node, err)
			}
			if err := k.h.NeighSet(&netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
				State: netlink.NUD_PERMANENT, IP: r.via.AsSlice(), HardwareAddr: mac}); err != nil {
				return fmt.Errorf("forwarding entry %s → %s for Node %s: %w", mac, r.via, r.node, err)
			}
		}
		if err := k.h.RouteReplace(nr); err != nil {
			return fmt.Errorf("route %s via %s for Node %s: %w", r.cidr, r.via, r.node, err)
		}
	}
	have, err := k.h.RouteListFiltered(family(six), &netlink.Route{Protocol: Protocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	for _, r := range have {
		if p, ok := prefixOf(r.Dst); ok && !want[p] {
			if err := k.h.RouteDel(&r); err != nil {
				return fmt.Errorf("delete route %s: %w", p, err)
			}
		}
	}
	if dev != nil {
		return k.pruneNeighbours(dev, six, tunnelled)
	}
	return nil
}

// pruneNeighbours deletes the neighbour and forwarding entries of dev
// that no route of rs needs.
func (k kernel) pruneNeighbours(dev netlink.Link, six bool, rs []route) error {
	gws, macs := map[netip.Addr]bool{}, map[string]bool{}
	for _, r := range rs {
		gws[r.cidr.Addr()] = true
		macs[deviceMAC(r.via).String()] = true
	}
	ns, err := k.h.NeighList(dev.Attrs().Index, family(six))
	if err != nil {
		return fmt.Errorf("list neighbours of %s: %w", dev.Attrs().Name, err)
	}
	for _, n := range ns {
		if ip, ok := netip.AddrFromSlice(n.IP); ok && !gws[ip.Unmap()] {
			if err := k.h.NeighDel(&n); err != nil {
				return fmt.Errorf("delete neighbour %s: %w", ip, err)
			}
		}
	}
	fdb, err := k.h.NeighList(dev.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("list forwarding entries of %s: %w", dev.Attrs().Name, err)
	}
	for _, n := range fdb {
		if !macs[n.HardwareAddr.String()] {
			if err := k.h.NeighDel(&n); err != nil {
				return fmt.Errorf("delete forwarding entry %s: %w", n.HardwareAddr, err)
			}
		}
	}
	return nil
}

// device returns the family's VXLAN device, set up for s, if needed;
// else it deletes it if it exists, and returns nil.
func (k kernel) device(s *self, six, needed bool) (netlink.Link, error) {
	name := deviceName(six)
	old, err := k.h.LinkByName(name)
	if err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil, fmt.Errorf("find %s: %w", name, err)
	}
	local := s.addrs[six]
	if old != nil {
		if vx, ok := old.(*netlink.Vxlan); needed && ok && vx.VxlanId == vxlanID && vx.Port == vxlanPort &&
			vx.SrcAddr.Equal(local.AsSlice()) && vx.HardwareAddr.String() == deviceMAC(local).String() {
			return old, k.deviceSettings(old, s, six)
		}
		if err := k.h.LinkDel(old); err != nil {
			return nil, fmt.Errorf("delete %s: %w", name, err)
		}
	}
	if !needed {
		return nil, nil
	}
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: deviceMAC(local)},
		VxlanId:   vxlanID, SrcAddr: local.AsSlice(), Port: vxlanPort,
		// Every peer is known from its Node: nothing to learn.
		Learning: false,
	}
	if err := k.h.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("add %s: %w", name, err)
	}
	dev, err := k.h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", name, err)
	}
	return dev, k.deviceSettings(dev, s, six)
}

// deviceSettings sets dev's MTU (its underlay's less VXLAN's overhead) and
// address (the first of the node's pod CIDR of the family, so that what
// the node itself sends through it comes from an address the other nodes
// route back here), and brings it up.
func (k kernel) deviceSettings(dev netlink.Link, s *self, six bool) error {
	name := dev.Attrs().Name
	mtu, err := k.linkMTU(s.addrs[six])
	if err != nil {
		return err
	}
	if mtu -= overhead(six); dev.Attrs().MTU != mtu {
		if err := k.h.LinkSetMTU(dev, mtu); err != nil {
			return fmt.Errorf("set %s's MTU to %d: %w", name, mtu, err)
		}
	}
	for _, c := range s.cidrs {
		if c.Addr().Is6() != six {
			continue
		}
		a := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(c.Addr(), c.Addr().BitLen()))}
		if err := k.h.AddrReplace(dev, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", a.IPNet, name, err)
		}
	}
	if err := k.h.LinkSetUp(dev); err != nil {
		return fmt.Errorf("bring %s up: %w", name, err)
	}
	return nil
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}
