package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/internal/backoff"
	"github.com/cairn-os/cairn/machineconfig"
)

const (
	// linkWait bounds the wait for NIC drivers to register the links the
	// config names; the drivers probe while their modules load, so links
	// are normally there at once.
	linkWait = 3 * time.Second
	// dhcpTimeout bounds one attempt at a lease on a link.
	dhcpTimeout = 20 * time.Second
	// dhcpBootWait is how long the boot waits for leases before it goes
	// on: a lease not in by then is still applied when it comes, and the
	// services (the API among them) start meanwhile.
	dhcpBootWait = 5 * time.Second
	// dhcpRetry is the pause before asking again on a link that got no
	// lease (a DHCP server may come up after the node), doubling up to
	// dhcpRetryMax.
	dhcpRetry    = 30 * time.Second
	dhcpRetryMax = 5 * time.Minute
)

// configureNetwork brings up loopback and every interface of the machine
// config. A problem with one interface is reported and the others are still
// configured; the agent listens on whatever addresses the node ends with.
// DHCP runs in the background: the step waits up to dhcpBootWait from its
// start for the leases, and each link's first DHCP exchange is a boot timeline record of
// its own ("DHCP on eth0"), with its error if it got no lease.
func (n *node) configureNetwork(network machineconfig.Network) error {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	// The wait for leases counts from here, alongside the wait for links.
	leaseDeadline := time.Now().Add(dhcpBootWait)
	nameservers := network.Nameservers
	// Interfaces are configured side by side: a missing link on one does
	// not hold up the others.
	ifaces := network.Interfaces
	errs := make([]error, len(ifaces))
	leases := make([]<-chan error, len(ifaces))
	var wg sync.WaitGroup
	for i, ic := range ifaces {
		path := fmt.Sprintf("network.interfaces[%d]", i)
		wg.Go(func() {
			err := boot.Catch("configure "+path, func() error {
				link, err := configureInterface(ic)
				if err == nil && ic.DHCP {
					leases[i] = n.startDHCP(path, link, nameservers)
				}
				return err
			})
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", path, err)
			}
		})
	}
	wg.Wait()
	if len(nameservers) > 0 {
		errs = append(errs, writeResolvConf(nameservers))
	}
	waitLeases(leases, ifaces, leaseDeadline)
	return errors.Join(errs...)
}

// waitLeases waits until deadline for the first DHCP exchange on each link
// that has one (a nil channel has none); their outcome is reported by
// their own timeline records.
func waitLeases(leases []<-chan error, ifaces []machineconfig.Interface, deadline time.Time) {
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	var pending []string
	for i, ch := range leases {
		if ch == nil {
			continue
		}
		select {
		case <-ch:
			continue
		case <-timeout.C:
		}
		// Out of time: note this one and every other still waiting.
		for j := i; j < len(leases); j++ {
			if leases[j] == nil {
				continue
			}
			select {
			case <-leases[j]:
			default:
				pending = append(pending, fmt.Sprintf("network.interfaces[%d] (%s)", j, linkLabel(ifaces[j])))
			}
		}
		break
	}
	if len(pending) > 0 {
		slog.Warn("no DHCP lease yet, going on: still asking in the background", "interfaces", strings.Join(pending, ", "), "waited", dhcpBootWait)
	}
}

// linkLabel names the link an interface config selects, for messages.
func linkLabel(ic machineconfig.Interface) string {
	switch {
	case ic.Name != "":
		return ic.Name
	case ic.MAC != "":
		return ic.MAC
	}
	return "first link"
}

func writeResolvConf(nameservers []string) error {
	var b strings.Builder
	for _, s := range nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	return os.WriteFile("/etc/resolv.conf", []byte(b.String()), 0o644)
}

// configureInterface finds the link of ic and sets its MTU, brings it up,
// and adds the static addresses and routes; DHCP is left to the caller.
func configureInterface(ic machineconfig.Interface) (netlink.Link, error) {
	link, err := findLink(ic, linkWait)
	if err != nil {
		return nil, err
	}
	name := link.Attrs().Name
	if ic.MTU > 0 {
		if err := netlink.LinkSetMTU(link, ic.MTU); err != nil {
			return nil, fmt.Errorf("set mtu %d on %s: %w", ic.MTU, name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("bring up %s: %w", name, err)
	}
	for _, a := range ic.Addresses {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return nil, err
		}
		if err := netlink.AddrReplace(link, addr); err != nil {
			return nil, fmt.Errorf("add %s to %s: %w", a, name, err)
		}
	}
	for _, r := range ic.Routes {
		_, dst, err := net.ParseCIDR(r.To)
		if err != nil {
			return nil, err
		}
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: net.ParseIP(r.Via), Priority: int(r.Metric)}
		if err := netlink.RouteReplace(route); err != nil {
			return nil, fmt.Errorf("add route to %s via %s on %s: %w", r.To, r.Via, name, err)
		}
	}
	slog.Info("interface configured", "link", name, "addresses", ic.Addresses, "dhcp", ic.DHCP)
	return link, nil
}

// findLink finds the link an interface config selects: by name, by MAC, or
// (neither set) the first link that is not loopback, waiting up to wait
// for a driver to register it.
func findLink(ic machineconfig.Interface, wait time.Duration) (netlink.Link, error) {
	var mac net.HardwareAddr
	if ic.MAC != "" {
		var err error
		if mac, err = net.ParseMAC(ic.MAC); err != nil {
			return nil, err
		}
	}
	matches := func(l netlink.Link) bool {
		a := l.Attrs()
		return ic.Name != "" && a.Name == ic.Name ||
			mac != nil && bytes.Equal(a.HardwareAddr, mac) ||
			ic.Name == "" && ic.MAC == "" && l.Type() == "device" && a.Flags&net.FlagLoopback == 0
	}
	deadline := time.Now().Add(wait)
	var seen []string
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("no link matches (name %q, mac %q) after %s; links: %s", ic.Name, ic.MAC, wait, strings.Join(seen, ", "))
		}
		if l, err := watchLinks(left, matches, &seen); l != nil || err != nil {
			return l, err
		}
	}
}

// watchLinks asks the kernel for the links there are, then for each new
// one, until one matches, wait has passed, or the kernel's messages are
// lost (a full socket buffer ends the subscription: the caller asks again).
// The links seen that do not match are added to seen, for a message.
func watchLinks(wait time.Duration, matches func(netlink.Link) bool, seen *[]string) (netlink.Link, error) {
	updates := make(chan netlink.LinkUpdate)
	done := make(chan struct{})
	// The subscription also ends on its own once no update came for wait.
	tv := unix.NsecToTimeval(wait.Nanoseconds())
	err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		ListExisting:   true,
		ReceiveTimeout: &tv,
		ErrorCallback:  func(error) {}, // its end, seen as the channel's close
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to link updates: %w", err)
	}
	defer func() {
		close(done)
		// The subscription sends until it notices: take what it still sends.
		boot.Go("drain link updates", func() {
			for range updates {
			}
		})
	}()
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	for {
		select {
		case u, ok := <-updates:
			if !ok {
				return nil, nil
			}
			if u.Header.Type != unix.RTM_NEWLINK {
				continue
			}
			if matches(u.Link) {
				return u.Link, nil
			}
			if a := u.Link.Attrs(); !slices.Contains(*seen, a.Name+" "+a.HardwareAddr.String()) {
				*seen = append(*seen, a.Name+" "+a.HardwareAddr.String())
			}
		case <-timeout.C:
			return nil, nil
		}
	}
}

// startDHCP asks for an IPv4 lease on link in the background, until it
// gets one (waiting dhcpRetry, doubling up to dhcpRetryMax with jitter, between attempts), and applies it (with the config's nameservers, if it has any,
// rather than the lease's). The first exchange's outcome is sent on the
// returned channel and added to the boot timeline as "DHCP on <link>";
// path is the interface's place in the config, for the error.
func (n *node) startDHCP(path string, link netlink.Link, nameservers []string) <-chan error {
	first := make(chan error, 1)
	name := link.Attrs().Name
	boot.Go("DHCP on "+name, func() {
		b := backoff.Backoff{Initial: dhcpRetry, Max: dhcpRetryMax, Jitter: 0.2}
		delay := b.Next()
		for attempt := 0; ; attempt++ {
			start := boot.SinceBoot()
			err := dhcp(link, dhcpTimeout)
			if err == nil && len(nameservers) > 0 {
				err = writeResolvConf(nameservers)
			}
			if attempt == 0 {
				first <- err
				r := boot.Record{Name: "DHCP on " + name, Start: start, Duration: boot.SinceBoot() - start}
				if err != nil {
					r.Err = fmt.Sprintf("%s: %v; asking again in the background", path, err)
				}
				n.timeline.Add(r)
			}
			if err == nil {
				if attempt > 0 {
					slog.Info("DHCP lease after retrying", "link", name, "attempts", attempt+1)
				}
				return
			}
			if attempt == 0 {
				slog.Warn("DHCP got no lease, asking again in the background", "link", name, "err", err, "after", delay.Round(time.Millisecond))
			}
			time.Sleep(delay)
			delay = b.Next()
		}
	})
	return first
}

// dhcp asks for an IPv4 lease on link for up to timeout and applies it.
func dhcp(link netlink.Link, timeout time.Duration) error {
	name := link.Attrs().Name
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
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
	if len(errs) == 0 {
		errs = append(errs, fmt.Errorf("link %s is not up", name))
	}
	return fmt.Errorf("DHCP on %s: no lease within %s: %w", name, timeout, errors.Join(errs...))
}
