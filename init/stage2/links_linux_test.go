package stage2

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/vmtest"
)

// TestApplyLinksBondVLAN makes, in a VM on the node's kernel and in a
// network namespace of the test's, a bond of two veth links (one by name,
// one by MAC) with a VLAN on it and a VLAN on a plain link, then applies
// the config again without the bond's VLAN, then without the bond: what
// the config no longer has is removed, the rest kept.
func TestApplyLinksBondVLAN(t *testing.T) {
	// This host's kernel may lack bonding and 802.1Q; the node's has them.
	if !vmtest.Run(t, vmtest.Options{Modules: []string{"bonding", "8021q", "veth"}}) {
		return
	}
	if !inNamespaces(t, syscall.CLONE_NEWNET) {
		return
	}
	mac, _ := net.ParseMAC("02:00:00:00:20:02")
	for _, v := range []*netlink.Veth{
		{LinkAttrs: netlink.LinkAttrs{Name: "cairn0"}, PeerName: "cairn1"},
		{LinkAttrs: netlink.LinkAttrs{Name: "cairn2", HardwareAddr: mac}, PeerName: "cairn3"},
	} {
		if err := netlink.LinkAdd(v); err != nil {
			t.Fatal(err)
		}
	}
	cairn1, _ := netlink.LinkByName("cairn1")

	bondIface := machineconfig.Interface{
		Name:      "bond0",
		Addresses: []string{"192.0.2.10/24"},
		Bond:      &machineconfig.Bond{Interfaces: []string{"cairn0"}, DeviceSelectors: []machineconfig.DeviceSelector{{MAC: mac.String()}}, Mode: "active-backup", MIIMon: 100},
		VLANs:     []machineconfig.VLAN{{VLANID: 100, Addresses: []string{"198.51.100.10/24"}, MTU: 1400}},
	}
	plain := machineconfig.Interface{Name: "cairn1", VLANs: []machineconfig.VLAN{{VLANID: 5, DHCP: true}}}
	links, err := applyLinks(machineconfig.Network{Interfaces: []machineconfig.Interface{bondIface, plain}})
	if err != nil {
		t.Fatalf("applyLinks() = %v", err)
	}
	var dhcp []string
	for _, l := range links {
		if l.dhcp {
			dhcp = append(dhcp, l.path+" "+l.link.Attrs().Name)
		}
	}
	if len(links) != 4 || len(dhcp) != 1 || dhcp[0] != "network.interfaces[1].vlans[0] cairn1.5" {
		t.Errorf("applyLinks() links %v, want bond0, bond0.100, cairn1 and cairn1.5, DHCP on cairn1.5 only", links)
	}
	bond, err := netlink.LinkByName("bond0")
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := bond.(*netlink.Bond); !ok || b.Mode != netlink.BOND_MODE_ACTIVE_BACKUP || b.Miimon != 100 {
		t.Errorf("bond0 = %+v, want an active-backup bond with miimon 100", bond)
	}
	for _, name := range []string{"cairn0", "cairn2"} {
		if l, _ := netlink.LinkByName(name); l == nil || l.Attrs().MasterIndex != bond.Attrs().Index {
			t.Errorf("%s is not a member of bond0", name)
		}
	}
	wantVLAN(t, "bond0.100", bond.Attrs().Index, 100, 1400, "198.51.100.10/24")
	wantVLAN(t, "cairn1.5", cairn1.Attrs().Index, 5, 0, "")

	// Again, without the bond's VLAN: the rest stays as it is.
	bondIface.VLANs = nil
	if _, err := applyLinks(machineconfig.Network{Interfaces: []machineconfig.Interface{bondIface, plain}}); err != nil {
		t.Fatalf("applyLinks() without bond0's VLAN = %v", err)
	}
	if _, err := netlink.LinkByName("bond0.100"); err == nil {
		t.Error("bond0.100 is still there, want it removed")
	}
	wantVLAN(t, "cairn1.5", cairn1.Attrs().Index, 5, 0, "")
	// Without the bond: removed, its members free.
	if _, err := applyLinks(machineconfig.Network{Interfaces: []machineconfig.Interface{plain}}); err != nil {
		t.Fatalf("applyLinks() without the bond = %v", err)
	}
	if _, err := netlink.LinkByName("bond0"); err == nil {
		t.Error("bond0 is still there, want it removed")
	}
	if l, _ := netlink.LinkByName("cairn0"); l == nil || l.Attrs().MasterIndex != 0 {
		t.Error("cairn0 is still in a bond")
	}
}

// wantVLAN checks that name is VLAN id on the link parent, with mtu (0:
// any) and addr (if not empty).
func wantVLAN(t *testing.T, name string, parent, id, mtu int, addr string) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Errorf("VLAN %s: %v", name, err)
		return
	}
	v, ok := l.(*netlink.Vlan)
	if !ok || v.VlanId != id || v.ParentIndex != parent || mtu != 0 && v.MTU != mtu || v.Flags&net.FlagUp == 0 {
		t.Errorf("%s = %+v, want VLAN %d on link %d, mtu %d, up", name, l, id, parent, mtu)
	}
	if addr == "" {
		return
	}
	addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != addr {
		t.Errorf("%s addresses %v, want %s", name, addrs, addr)
	}
}

// TestReconfigureLinks changes a link's addresses, routes and MTU as a
// config applied live does, in a network namespace of the test's: what
// the new config has is added, what only the old one had is removed, the
// rest kept.
func TestReconfigureLinks(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWNET) {
		return
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cairn0"}, PeerName: "cairn1"}); err != nil {
		t.Fatal(err)
	}
	// The second interface matches no link, at boot as now: unchanged, it
	// does not fail the change.
	network := func(mtu int, addrs []string, routes ...machineconfig.Route) machineconfig.Network {
		return machineconfig.Network{Interfaces: []machineconfig.Interface{
			{Name: "cairn0", MTU: mtu, Addresses: addrs, Routes: routes},
			{MAC: "02:00:00:00:00:99", Addresses: []string{"192.0.2.99/24"}},
		}}
	}
	old := network(1500, []string{"192.0.2.10/24", "198.51.100.10/24"}, machineconfig.Route{To: "203.0.113.0/24", Via: "192.0.2.1"})
	if _, err := applyLinks(old); err == nil || !strings.Contains(err.Error(), "network.interfaces[1]") {
		t.Fatalf("applyLinks() = %v, want network.interfaces[1] reported", err)
	}
	next := network(1400, []string{"192.0.2.10/24", "192.0.2.11/24"}, machineconfig.Route{To: "203.0.113.128/25", Via: "192.0.2.1", Metric: 10})
	links, dropped, err := reconfigureLinks(old, next)
	if err != nil || len(links) != 1 || len(dropped) != 0 {
		t.Fatalf("reconfigureLinks() = %v, %v, %v", links, dropped, err)
	}
	link, err := netlink.LinkByName("cairn0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := netlink.AddrList(link, netlink.FAMILY_V4)
	var got []string
	for _, a := range addrs {
		got = append(got, a.IPNet.String())
	}
	slices.Sort(got)
	if want := []string{"192.0.2.10/24", "192.0.2.11/24"}; !slices.Equal(got, want) {
		t.Errorf("addresses %v, want %v", got, want)
	}
	routes, _ := netlink.RouteList(link, netlink.FAMILY_V4)
	var gw []string
	for _, r := range routes {
		if r.Gw != nil {
			gw = append(gw, fmt.Sprintf("%s via %s metric %d", r.Dst, r.Gw, r.Priority))
		}
	}
	if want := []string{"203.0.113.128/25 via 192.0.2.1 metric 10"}; !slices.Equal(gw, want) {
		t.Errorf("routes via a gateway %v, want %v", gw, want)
	}
	if link.Attrs().MTU != 1400 {
		t.Errorf("MTU %d, want 1400", link.Attrs().MTU)
	}
}
