package stage2

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/machineconfig"
)

// madeAlias is the alias (IFLA_IFALIAS) of the links the node makes, bonds
// and VLANs, followed by their place in the config: a link with it that
// the config no longer has is the node's to remove.
const madeAlias = "cairn: "

// configuredLink is a link the config set up, and whether it wants DHCP.
type configuredLink struct {
	path string // its place in the config, e.g. network.interfaces[0].vlans[1]
	link netlink.Link
	dhcp bool
}

// applyLinks makes the links match network: the bonds made and their
// members enslaved, the VLANs made on their links, then every link's MTU,
// state, static addresses and routes set, and the bonds and VLANs the node
// made before that the config no longer has removed. It runs again on a
// node already set up without changing what already matches. A problem
// with one interface is reported with its path and the others are still
// set up. It returns the links set up (DHCP is the caller's).
func applyLinks(network machineconfig.Network) ([]configuredLink, error) {
	ifaces := network.Interfaces
	errs := make([]error, len(ifaces))
	done := make([][]configuredLink, len(ifaces))
	// Interfaces are set up side by side: a missing link on one does not
	// hold up the others.
	var wg sync.WaitGroup
	for i, ic := range ifaces {
		path := fmt.Sprintf("network.interfaces[%d]", i)
		wg.Go(func() {
			errs[i] = boot.Catch("configure "+path, func() (err error) {
				done[i], err = applyInterface(path, ic)
				return err
			})
		})
	}
	wg.Wait()
	var links []configuredLink
	for _, d := range done {
		links = append(links, d...)
	}
	errs = append(errs, removeUnconfigured(network, links))
	return links, errors.Join(errs...)
}

// applyInterface sets up one interface of the config and its VLANs.
func applyInterface(path string, ic machineconfig.Interface) (links []configuredLink, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("%s: %w", path, err)
		}
	}()
	var link netlink.Link
	var errs []error
	if ic.Bond != nil {
		// A member missing is reported; the bond works with the others.
		link, err = ensureBond(path, ic.Name, ic.Bond)
		errs = append(errs, err)
	} else {
		link, err = findLink(ic, linkWait)
	}
	if link == nil {
		return nil, err
	}
	if err := configureLink(link, ic.MTU, ic.Addresses, ic.Routes); err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	slog.Info("interface configured", "link", link.Attrs().Name, "addresses", ic.Addresses, "dhcp", ic.DHCP)
	links = append(links, configuredLink{path: path, link: link, dhcp: ic.DHCP})
	for i, vl := range ic.VLANs {
		vpath := fmt.Sprintf("%s.vlans[%d]", path, i)
		vlink, err := ensureVLAN(vpath, link, vl.VLANID)
		if err == nil {
			err = configureLink(vlink, vl.MTU, vl.Addresses, vl.Routes)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("vlans[%d]: %w", i, err))
			continue
		}
		slog.Info("VLAN configured", "link", vlink.Attrs().Name, "addresses", vl.Addresses, "dhcp", vl.DHCP)
		links = append(links, configuredLink{path: vpath, link: vlink, dhcp: vl.DHCP})
	}
	return links, errors.Join(errs...)
}

// configureLink sets link's MTU, brings it up, and adds the static
// addresses and routes.
func configureLink(link netlink.Link, mtu int, addresses []string, routes []machineconfig.Route) error {
	name := link.Attrs().Name
	if mtu > 0 && link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return fmt.Errorf("set mtu %d on %s: %w", mtu, name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring up %s: %w", name, err)
	}
	for _, a := range addresses {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return err
		}
		if err := netlink.AddrReplace(link, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", a, name, err)
		}
	}
	for _, r := range routes {
		_, dst, err := net.ParseCIDR(r.To)
		if err != nil {
			return err
		}
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: net.ParseIP(r.Via), Priority: int(r.Metric)}
		if err := netlink.RouteReplace(route); err != nil {
			return fmt.Errorf("add route to %s via %s on %s: %w", r.To, r.Via, name, err)
		}
	}
	return nil
}

// ensureBond makes the bond name (unless there is one already: its mode
// is then kept, as the kernel changes it only without members) and
// enslaves its members, found by name or MAC.
func ensureBond(path, name string, b *machineconfig.Bond) (netlink.Link, error) {
	link, err := netlink.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		bond := netlink.NewLinkBond(netlink.LinkAttrs{Name: name})
		bond.Mode = netlink.StringToBondMode(b.Mode)
		bond.Miimon, bond.UpDelay, bond.DownDelay = b.MIIMon, b.UpDelay, b.DownDelay
		if b.LACPRate != "" {
			bond.LacpRate = netlink.StringToBondLacpRate(b.LACPRate)
		}
		if b.XmitHashPolicy != "" {
			bond.XmitHashPolicy = netlink.StringToBondXmitHashPolicy(b.XmitHashPolicy)
		}
		if err := netlink.LinkAdd(bond); err != nil {
			return nil, fmt.Errorf("make bond %s: %w", name, err)
		}
		if link, err = netlink.LinkByName(name); err != nil {
			return nil, fmt.Errorf("find bond %s: %w", name, err)
		}
		if err := netlink.LinkSetAlias(link, madeAlias+path); err != nil {
			return nil, fmt.Errorf("mark bond %s: %w", name, err)
		}
		slog.Info("bond made", "link", name, "mode", b.Mode)
	case err != nil:
		return nil, fmt.Errorf("find bond %s: %w", name, err)
	case link.Type() != "bond":
		return nil, fmt.Errorf("link %s is a %s, not a bond", name, link.Type())
	}
	var members []machineconfig.Interface
	for _, m := range b.Interfaces {
		members = append(members, machineconfig.Interface{Name: m})
	}
	for _, d := range b.DeviceSelectors {
		members = append(members, machineconfig.Interface{MAC: d.MAC})
	}
	var errs []error
	for _, m := range members {
		errs = append(errs, enslave(link, m))
	}
	return link, errors.Join(errs...)
}

// enslave makes the link m selects a member of bond.
func enslave(bond netlink.Link, m machineconfig.Interface) error {
	member, err := findLink(m, linkWait)
	if err != nil {
		return fmt.Errorf("bond %s member: %w", bond.Attrs().Name, err)
	}
	name := member.Attrs().Name
	if member.Attrs().MasterIndex == bond.Attrs().Index {
		return nil
	}
	// The kernel takes only members that are down; the bond brings them up.
	if err := netlink.LinkSetDown(member); err != nil {
		return fmt.Errorf("bring down %s for bond %s: %w", name, bond.Attrs().Name, err)
	}
	if err := netlink.LinkSetMasterByIndex(member, bond.Attrs().Index); err != nil {
		return fmt.Errorf("add %s to bond %s: %w", name, bond.Attrs().Name, err)
	}
	if err := netlink.LinkSetUp(member); err != nil {
		return fmt.Errorf("bring up %s in bond %s: %w", name, bond.Attrs().Name, err)
	}
	slog.Info("bond member added", "bond", bond.Attrs().Name, "link", name)
	return nil
}

// ensureVLAN makes the VLAN link id on parent, <parent>.<id>, unless it
// is there.
func ensureVLAN(path string, parent netlink.Link, id int) (netlink.Link, error) {
	name := machineconfig.VLANLinkName(parent.Attrs().Name, id)
	link, err := netlink.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		vlan := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: name, ParentIndex: parent.Attrs().Index}, VlanId: id}
		if err := netlink.LinkAdd(vlan); err != nil {
			return nil, fmt.Errorf("make VLAN %s: %w", name, err)
		}
		if link, err = netlink.LinkByName(name); err != nil {
			return nil, fmt.Errorf("find VLAN %s: %w", name, err)
		}
		if err := netlink.LinkSetAlias(link, madeAlias+path); err != nil {
			return nil, fmt.Errorf("mark VLAN %s: %w", name, err)
		}
		slog.Info("VLAN made", "link", name, "parent", parent.Attrs().Name, "id", id)
		return link, nil
	case err != nil:
		return nil, fmt.Errorf("find VLAN %s: %w", name, err)
	}
	if v, ok := link.(*netlink.Vlan); !ok || v.VlanId != id || v.ParentIndex != parent.Attrs().Index {
		return nil, fmt.Errorf("link %s is there, but not VLAN %d on %s", name, id, parent.Attrs().Name)
	}
	return link, nil
}

// removeUnconfigured removes the bonds and VLANs the node made that are
// not among the links set up now, nor named by network (a bond, or a VLAN
// on a link selected by name: a link the config has, whose setup failed
// this time, is kept), VLANs first.
func removeUnconfigured(network machineconfig.Network, links []configuredLink) error {
	wanted := map[string]bool{}
	for _, l := range links {
		wanted[l.link.Attrs().Name] = true
	}
	for _, ic := range network.Interfaces {
		if ic.Bond != nil {
			wanted[ic.Name] = true
		}
		for _, vl := range ic.VLANs {
			if ic.Name != "" {
				wanted[machineconfig.VLANLinkName(ic.Name, vl.VLANID)] = true
			}
		}
	}
	all, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	// VLANs before bonds: a VLAN may be on a bond.
	for _, kind := range []string{"vlan", "bond"} {
		for _, l := range all {
			a := l.Attrs()
			if l.Type() != kind || !strings.HasPrefix(a.Alias, madeAlias) || wanted[a.Name] {
				continue
			}
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("remove %s %s, no longer in the config: %w", kind, a.Name, err))
				continue
			}
			slog.Info("link removed: no longer in the config", "link", a.Name, "was", strings.TrimPrefix(a.Alias, madeAlias))
		}
	}
	return errors.Join(errs...)
}

// reconfigureLinks makes a running node's links go from old to new,
// interface by interface, touching only those whose config changed (one
// that failed at boot, a link not there, is left to fail there): the
// interface set up again as at boot (applyInterface: new VLANs made,
// addresses, routes and MTU set), then the static addresses and routes
// that old had and new has not removed, and the VLANs old had and new has
// not deleted. Which links the config selects does not change live (a
// reboot change), so old and new list the same interfaces. It returns the
// links set up and the names of the VLANs deleted.
func reconfigureLinks(old, new machineconfig.Network) (links []configuredLink, dropped []string, err error) {
	var errs []error
	for i, now := range new.Interfaces {
		if i >= len(old.Interfaces) || reflect.DeepEqual(old.Interfaces[i], now) {
			continue
		}
		was := old.Interfaces[i]
		path := fmt.Sprintf("network.interfaces[%d]", i)
		set, err := applyInterface(path, now)
		links = append(links, set...)
		errs = append(errs, err)
		byPath := map[string]netlink.Link{}
		for _, l := range set {
			byPath[l.path] = l.link
		}
		parent := byPath[path]
		if parent == nil {
			continue // not found: reported by applyInterface
		}
		errs = append(errs, dropStale(parent, was.Addresses, now.Addresses, was.Routes, now.Routes))
		for _, vl := range was.VLANs {
			j := slices.IndexFunc(now.VLANs, func(v machineconfig.VLAN) bool { return v.VLANID == vl.VLANID })
			if j >= 0 {
				vpath := fmt.Sprintf("%s.vlans[%d]", path, j)
				errs = append(errs, dropStale(byPath[vpath], vl.Addresses, now.VLANs[j].Addresses, vl.Routes, now.VLANs[j].Routes))
				continue
			}
			name := machineconfig.VLANLinkName(parent.Attrs().Name, vl.VLANID)
			if err := deleteMade(name); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", path, err))
				continue
			}
			dropped = append(dropped, name)
		}
	}
	return links, dropped, errors.Join(errs...)
}

// deleteMade deletes the link name if the node made it (its alias says
// so); one that is not there is gone already.
func deleteMade(name string) error {
	l, err := netlink.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return nil
	case err != nil:
		return err
	case !strings.HasPrefix(l.Attrs().Alias, madeAlias):
		return fmt.Errorf("link %s was not made by the node: left alone", name)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("remove VLAN %s, no longer in the config: %w", name, err)
	}
	slog.Info("link removed: no longer in the config", "link", name)
	return nil
}

// dropStale removes from link the addresses and routes that were set and
// are not wanted now.
func dropStale(link netlink.Link, wasAddrs, nowAddrs []string, wasRoutes, nowRoutes []machineconfig.Route) error {
	if link == nil {
		return nil
	}
	name := link.Attrs().Name
	var errs []error
	for _, a := range wasAddrs {
		if slices.Contains(nowAddrs, a) {
			continue
		}
		addr, err := netlink.ParseAddr(a)
		if err == nil {
			err = netlink.AddrDel(link, addr)
		}
		if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("remove %s from %s: %w", a, name, err))
			continue
		}
		slog.Info("address removed: no longer in the config", "link", name, "address", a)
	}
	for _, r := range wasRoutes {
		if slices.Contains(nowRoutes, r) {
			continue
		}
		_, dst, err := net.ParseCIDR(r.To)
		if err == nil {
			err = netlink.RouteDel(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: net.ParseIP(r.Via), Priority: int(r.Metric)})
		}
		if err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("remove route to %s via %s from %s: %w", r.To, r.Via, name, err))
			continue
		}
		slog.Info("route removed: no longer in the config", "link", name, "to", r.To, "via", r.Via)
	}
	return errors.Join(errs...)
}
