package machineconfig

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// Network configures links, addresses, routes and DNS.
type Network struct {
	// Interfaces are the links to configure. If none are given,
	// SetDefaults adds one with an empty selector and DHCP enabled.
	Interfaces  []Interface `json:"interfaces,omitempty"`
	Nameservers []string    `json:"nameservers,omitempty"`
	// SearchDomains are the resolver's search list (the search line of
	// the node's resolv.conf). When empty, the DHCP leases' domain search
	// option is used.
	SearchDomains []string `json:"searchDomains,omitempty"`
	// ExtraHostEntries are written into the node's /etc/hosts after the
	// node's own lines.
	ExtraHostEntries []HostEntry `json:"extraHostEntries,omitempty"`
}

// HostEntry is one line of /etc/hosts.
type HostEntry struct {
	// IP is an IPv4 or IPv6 address.
	IP string `json:"ip"`
	// Aliases are the names that resolve to IP; at least one.
	Aliases []string `json:"aliases"`
}

// Interface configures one link. It selects the link by exactly one of Name
// or MAC. An empty selector (both empty) means the first link that is not
// loopback; it is only allowed when it is the only interface. With Bond
// set, the link is a bond that the node makes, named Name.
type Interface struct {
	// Name selects the link by kernel name, e.g. eth0.
	Name string `json:"name,omitempty"`
	// MAC selects the link by hardware address, e.g. 52:54:00:12:34:56.
	MAC  string `json:"mac,omitempty"`
	DHCP bool   `json:"dhcp,omitempty"`
	// Addresses are static addresses in CIDR notation, e.g. 10.0.2.15/24.
	Addresses []string `json:"addresses,omitempty"`
	Routes    []Route  `json:"routes,omitempty"`
	// MTU of the link; 0 leaves it as is.
	MTU int `json:"mtu,omitempty"`
	// Bond makes this link a bond of the member links it lists.
	Bond *Bond `json:"bond,omitempty"`
	// VLANs are 802.1Q links on top of this one, each named
	// <link>.<vlanId>.
	VLANs []VLAN `json:"vlans,omitempty"`
}

// VLAN configures an 802.1Q VLAN link on its interface's link.
type VLAN struct {
	// VLANID is the 802.1Q tag, 1..4094.
	VLANID    int      `json:"vlanId"`
	DHCP      bool     `json:"dhcp,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
	Routes    []Route  `json:"routes,omitempty"`
	// MTU of the VLAN link; 0 leaves the kernel's (its parent's).
	MTU int `json:"mtu,omitempty"`
}

// Bond configures a Linux bond: its members (by name or by MAC) and its
// mode. The times are in milliseconds, as the kernel's bonding options.
type Bond struct {
	// Interfaces are members by kernel name.
	Interfaces []string `json:"interfaces,omitempty"`
	// DeviceSelectors are members by hardware address.
	DeviceSelectors []DeviceSelector `json:"deviceSelectors,omitempty"`
	// Mode is one of BondModes.
	Mode string `json:"mode"`
	// MIIMon is the link monitoring interval; 0 turns monitoring off.
	MIIMon    int `json:"miimon,omitempty"`
	UpDelay   int `json:"updelay,omitempty"`
	DownDelay int `json:"downdelay,omitempty"`
	// LACPRate is slow or fast; 802.3ad only.
	LACPRate string `json:"lacpRate,omitempty"`
	// XmitHashPolicy is one of BondXmitHashPolicies; for the balance-xor,
	// 802.3ad and balance-tlb modes.
	XmitHashPolicy string `json:"xmitHashPolicy,omitempty"`
}

// DeviceSelector selects a link by its hardware address.
type DeviceSelector struct {
	MAC string `json:"mac"`
}

// BondModes are the bonding modes, by the kernel's names.
var BondModes = []string{"balance-rr", "active-backup", "balance-xor", "broadcast", "802.3ad", "balance-tlb", "balance-alb"}

// BondXmitHashPolicies are the kernel's transmit hash policies.
var BondXmitHashPolicies = []string{"layer2", "layer3+4", "layer2+3", "encap2+3", "encap3+4", "vlan+srcmac"}

// Route is a static route through a gateway.
type Route struct {
	// To is the destination in CIDR notation; 0.0.0.0/0 or ::/0 for the
	// default route.
	To string `json:"to"`
	// Via is the gateway's IP address.
	Via    string `json:"via"`
	Metric uint32 `json:"metric,omitempty"`
}

// VLANLinkName is the name of the VLAN link with id on parent.
func VLANLinkName(parent string, id int) string {
	return fmt.Sprintf("%s.%d", parent, id)
}

// netSelectors records which config path selects each link name and MAC,
// so that a link selected twice is refused with both paths.
type netSelectors struct {
	names map[string]string // link name → path of the field using it
	macs  map[string]string // normalized MAC → path of the field using it
}

// selectName records that path selects the link called s; false (and an
// error at path) if another field did already.
func (v *validator) selectName(sel netSelectors, path, s string) bool {
	switch {
	case !validIfaceName(s):
		v.add(path, "%q is not a valid interface name: use at most 15 characters, without '/', ':' or spaces", s)
	case sel.names[s] != "" && sel.names[s] != path:
		v.add(path, "%q is already selected by %s", s, sel.names[s])
	default:
		sel.names[s] = path
		return true
	}
	return false
}

// selectMAC is selectName for a link selected by hardware address.
func (v *validator) selectMAC(sel netSelectors, path, s string) {
	hw, err := net.ParseMAC(s)
	switch {
	case err != nil:
		v.add(path, "%q is not a MAC address", s)
	case sel.macs[hw.String()] != "" && sel.macs[hw.String()] != path:
		v.add(path, "%q is already selected by %s", s, sel.macs[hw.String()])
	default:
		sel.macs[hw.String()] = path
	}
}

func (v *validator) network(n *Network) {
	if len(n.Interfaces) == 0 {
		v.add("network.interfaces", "required")
	}
	sel := netSelectors{names: map[string]string{}, macs: map[string]string{}}
	// A bond member is the bond's wherever in the document another
	// interface selects it too: that one is refused.
	for i, in := range n.Interfaces {
		if in.Bond == nil {
			continue
		}
		path := fmt.Sprintf("network.interfaces[%d].bond", i)
		for j, name := range in.Bond.Interfaces {
			if sel.names[name] == "" {
				sel.names[name] = fmt.Sprintf("%s.interfaces[%d]", path, j)
			}
		}
		for j, d := range in.Bond.DeviceSelectors {
			if hw, err := net.ParseMAC(d.MAC); err == nil && sel.macs[hw.String()] == "" {
				sel.macs[hw.String()] = fmt.Sprintf("%s.deviceSelectors[%d].mac", path, j)
			}
		}
	}
	for i := range n.Interfaces {
		v.iface(fmt.Sprintf("network.interfaces[%d]", i), &n.Interfaces[i], len(n.Interfaces), sel)
	}
	for i, s := range n.Nameservers {
		if _, err := netip.ParseAddr(s); err != nil {
			v.add(fmt.Sprintf("network.nameservers[%d]", i), "%q is not an IP address", s)
		}
	}
	for i, d := range n.SearchDomains {
		path := fmt.Sprintf("network.searchDomains[%d]", i)
		switch {
		case !validDNSName(d):
			v.add(path, "%q is not a DNS name: use labels of letters, digits and '-' separated by '.', at most 253 characters", d)
		case slices.Contains(n.SearchDomains[:i], d):
			v.add(path, "%q is listed twice", d)
		}
	}
	for i, e := range n.ExtraHostEntries {
		path := fmt.Sprintf("network.extraHostEntries[%d]", i)
		if _, err := netip.ParseAddr(e.IP); err != nil {
			v.add(path+".ip", "%q is not an IP address", e.IP)
		}
		if len(e.Aliases) == 0 {
			v.add(path+".aliases", "required: at least one name")
		}
		for j, a := range e.Aliases {
			if !validDNSName(a) {
				v.add(fmt.Sprintf("%s.aliases[%d]", path, j), "%q is not a DNS name", a)
			}
		}
	}
}

// dnsNameRE matches DNS names: labels of letters, digits and '-', neither
// starting nor ending with '-'.
var dnsNameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

func validDNSName(s string) bool {
	return len(s) <= 253 && dnsNameRE.MatchString(s)
}

// validIfaceName reports whether the kernel accepts s as a link name.
func validIfaceName(s string) bool {
	return s != "" && len(s) <= 15 && s != "." && s != ".." && !strings.ContainsAny(s, "/: \t\n")
}

func (v *validator) iface(path string, in *Interface, count int, sel netSelectors) {
	switch {
	case in.Bond != nil && (in.Name == "" || in.MAC != ""):
		v.add(path, "a bond needs a name (of the link to make) and no mac")
	case in.Name != "" && in.MAC != "":
		v.add(path, "set exactly one of name or mac")
	case in.Name == "" && in.MAC == "" && count > 1:
		v.add(path, "set exactly one of name or mac")
	case in.Name != "":
		v.selectName(sel, path+".name", in.Name)
	case in.MAC != "":
		v.selectMAC(sel, path+".mac", in.MAC)
	}
	if in.Bond != nil {
		v.bond(path+".bond", in.Bond, sel)
	}
	// A link that carries VLANs may have no address of its own.
	if !in.DHCP && len(in.Addresses) == 0 && len(in.VLANs) == 0 {
		v.add(path, "needs dhcp: true or at least one address")
	}
	v.addressing(path, in.Addresses, in.Routes, in.MTU)
	for i := range in.VLANs {
		v.vlan(fmt.Sprintf("%s.vlans[%d]", path, i), in, i, sel)
	}
}

// addressing checks the addresses, routes and MTU of a link.
func (v *validator) addressing(path string, addresses []string, routes []Route, mtu int) {
	for i, a := range addresses {
		if _, err := netip.ParsePrefix(a); err != nil {
			v.add(fmt.Sprintf("%s.addresses[%d]", path, i), "%q is not a CIDR", a)
		}
	}
	for i := range routes {
		v.route(fmt.Sprintf("%s.routes[%d]", path, i), &routes[i])
	}
	if mtu != 0 && (mtu < 68 || mtu > 65535) {
		v.add(path+".mtu", "%d is out of range 68..65535 (or 0 to leave it as is)", mtu)
	}
}

func (v *validator) vlan(path string, in *Interface, i int, sel netSelectors) {
	vl := &in.VLANs[i]
	switch {
	case vl.VLANID < 1 || vl.VLANID > 4094:
		v.add(path+".vlanId", "%d is out of range 1..4094", vl.VLANID)
	case slices.ContainsFunc(in.VLANs[:i], func(o VLAN) bool { return o.VLANID == vl.VLANID }):
		v.add(path+".vlanId", "%d is listed twice", vl.VLANID)
	case in.Name != "":
		// The link's name is known: it must fit the kernel's limit.
		v.selectName(sel, path+".vlanId", VLANLinkName(in.Name, vl.VLANID))
	}
	if !vl.DHCP && len(vl.Addresses) == 0 {
		v.add(path, "needs dhcp: true or at least one address")
	}
	v.addressing(path, vl.Addresses, vl.Routes, vl.MTU)
}

func (v *validator) bond(path string, b *Bond, sel netSelectors) {
	if len(b.Interfaces)+len(b.DeviceSelectors) == 0 {
		v.add(path, "needs members: interfaces or deviceSelectors")
	}
	for i, name := range b.Interfaces {
		v.selectName(sel, fmt.Sprintf("%s.interfaces[%d]", path, i), name)
	}
	for i, d := range b.DeviceSelectors {
		v.selectMAC(sel, fmt.Sprintf("%s.deviceSelectors[%d].mac", path, i), d.MAC)
	}
	if !slices.Contains(BondModes, b.Mode) {
		v.add(path+".mode", "%q is not a bond mode; use one of %s", b.Mode, strings.Join(BondModes, ", "))
	}
	for _, f := range []struct {
		name string
		ms   int
	}{{"miimon", b.MIIMon}, {"updelay", b.UpDelay}, {"downdelay", b.DownDelay}} {
		if f.ms < 0 {
			v.add(path+"."+f.name, "%d is negative", f.ms)
		}
	}
	switch {
	case b.LACPRate == "":
	case b.Mode != "802.3ad":
		v.add(path+".lacpRate", "only for mode 802.3ad")
	case b.LACPRate != "slow" && b.LACPRate != "fast":
		v.add(path+".lacpRate", "%q is not slow or fast", b.LACPRate)
	}
	if b.XmitHashPolicy != "" && !slices.Contains(BondXmitHashPolicies, b.XmitHashPolicy) {
		v.add(path+".xmitHashPolicy", "%q is not a transmit hash policy; use one of %s", b.XmitHashPolicy, strings.Join(BondXmitHashPolicies, ", "))
	}
}

func (v *validator) route(path string, r *Route) {
	to, toErr := netip.ParsePrefix(r.To)
	switch {
	case r.To == "":
		v.add(path+".to", "required")
	case r.To == "default":
		v.add(path+".to", "%q is not a CIDR; use 0.0.0.0/0 or ::/0", r.To)
	case toErr != nil:
		v.add(path+".to", "%q is not a CIDR", r.To)
	case to.Masked() != to:
		v.add(path+".to", "%q has host bits set; use %q", r.To, to.Masked())
	}

	via, viaErr := netip.ParseAddr(r.Via)
	switch {
	case r.Via == "":
		v.add(path+".via", "required")
	case viaErr != nil:
		v.add(path+".via", "%q is not an IP address", r.Via)
	case toErr == nil && via.Unmap().Is4() != to.Addr().Unmap().Is4():
		v.add(path+".via", "%q is not in the address family of %q", r.Via, r.To)
	}
}
