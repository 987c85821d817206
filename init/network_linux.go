package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/vishvananda/netlink"
)

const (
	// linkWait bounds the wait for NIC drivers to register the links the
	// config names; the drivers probe while their modules load, so links
	// are normally there at once.
	linkWait    = 3 * time.Second
	dhcpTimeout = 20 * time.Second
)

// configureNetwork brings up loopback and every interface of the machine
// config. A problem with one interface is reported and the others are still
// configured; the agent listens on whatever addresses the node ends with.
func (n *node) configureNetwork() error {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	if n.cfg == nil {
		return errNoConfig
	}
	// Interfaces are configured side by side: a missing link or a slow
	// DHCP server on one does not hold up the others.
	errs := make([]error, len(n.cfg.Network.Interfaces))
	var wg sync.WaitGroup
	for i, ic := range n.cfg.Network.Interfaces {
		wg.Go(func() {
			if err := configureInterface(ic); err != nil {
				errs[i] = fmt.Errorf("network.interfaces[%d]: %w", i, err)
			}
		})
	}
	wg.Wait()
	if ns := n.cfg.Network.Nameservers; len(ns) > 0 {
		var b strings.Builder
		for _, s := range ns {
			fmt.Fprintf(&b, "nameserver %s\n", s)
		}
		if err := os.WriteFile("/etc/resolv.conf", []byte(b.String()), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func configureInterface(ic machineconfig.Interface) error {
	link, err := findLink(ic, linkWait)
	if err != nil {
		return err
	}
	name := link.Attrs().Name
	if ic.MTU > 0 {
		if err := netlink.LinkSetMTU(link, ic.MTU); err != nil {
			return fmt.Errorf("set mtu %d on %s: %w", ic.MTU, name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring up %s: %w", name, err)
	}
	for _, a := range ic.Addresses {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return err
		}
		if err := netlink.AddrReplace(link, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", a, name, err)
		}
	}
	for _, r := range ic.Routes {
		_, dst, err := net.ParseCIDR(r.To)
		if err != nil {
			return err
		}
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: net.ParseIP(r.Via), Priority: int(r.Metric)}
		if err := netlink.RouteReplace(route); err != nil {
			return fmt.Errorf("add route to %s via %s on %s: %w", r.To, r.Via, name, err)
		}
	}
	if ic.DHCP {
		return dhcp(link)
	}
	slog.Info("interface configured", "link", name, "addresses", ic.Addresses)
	return nil
}

// findLink finds the link an interface config selects: by name, by MAC, or
// (neither set) the first link that is not loopback.
func findLink(ic machineconfig.Interface, wait time.Duration) (netlink.Link, error) {
	var mac net.HardwareAddr
	if ic.MAC != "" {
		var err error
		if mac, err = net.ParseMAC(ic.MAC); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(wait)
	for {
		links, err := netlink.LinkList()
		if err != nil {
			return nil, err
		}
		for _, l := range links {
			a := l.Attrs()
			switch {
			case ic.Name != "" && a.Name == ic.Name,
				mac != nil && bytes.Equal(a.HardwareAddr, mac),
				ic.Name == "" && ic.MAC == "" && l.Type() == "device" && a.Flags&net.FlagLoopback == 0:
				return l, nil
			}
		}
		if time.Now().After(deadline) {
			var names []string
			for _, l := range links {
				names = append(names, l.Attrs().Name+" "+l.Attrs().HardwareAddr.String())
			}
			return nil, fmt.Errorf("no link matches (name %q, mac %q); links: %s", ic.Name, ic.MAC, strings.Join(names, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dhcp asks for an IPv4 lease on link and applies it.
func dhcp(link netlink.Link) error {
	name := link.Attrs().Name
	ctx, cancel := context.WithTimeout(context.Background(), dhcpTimeout)
	defer cancel()
	cfg := dhclient.Config{Timeout: 5 * time.Second, Retries: 3}
	var errs []error
	for res := range dhclient.SendRequests(ctx, []netlink.Link{link}, true, false, cfg, linkWait) {
		if res.Err != nil {
			errs = append(errs, res.Err)
			continue
		}
		if err := res.Lease.Configure(); err != nil {
			return fmt.Errorf("apply DHCP lease on %s: %w", name, err)
		}
		slog.Info("DHCP lease", "link", name, "lease", res.Lease.String())
		return nil
	}
	return fmt.Errorf("DHCP on %s: no lease: %w", name, errors.Join(errs...))
}
