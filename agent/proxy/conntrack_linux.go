package proxy

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ctFilter adapts a flowFilter to netlink's conntrack filter.
type ctFilter struct{ flowFilter }

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

func (f ctFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	return f.match(flow{
		proto:    protocol(fl.Forward.Protocol),
		origDst:  addrPort(fl.Forward.DstIP, fl.Forward.DstPort),
		replySrc: addrPort(fl.Reverse.SrcIP, fl.Reverse.SrcPort),
	})
}

// deleteFlows deletes the conntrack entries the filters select, in both IP
// families, and returns how many went.
func deleteFlows(h *netlink.Handle, filters []flowFilter) (uint, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	var v4, v6 []netlink.CustomConntrackFilter
	for _, f := range filters {
		if f.family == ipv6 {
			v6 = append(v6, ctFilter{f})
		} else {
			v4 = append(v4, ctFilter{f})
		}
	}
	var total uint
	for _, fam := range []struct {
		f       netlink.InetFamily
		filters []netlink.CustomConntrackFilter
	}{{unix.AF_INET, v4}, {unix.AF_INET6, v6}} {
		if len(fam.filters) == 0 {
			continue
		}
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam.f, fam.filters...)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
