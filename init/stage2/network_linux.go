package stage2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

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

// configureNetwork brings up loopback and every link of the machine config
// (see applyLinks), writes the extra host entries and resolv.conf, and
// keeps a DHCP lease on each link that asks for one until the shutdown.
// A problem with one interface is reported and the others are still
// configured; the agent listens on whatever addresses the node ends with.
// The step waits up to dhcpBootWait from its start for the first leases,
// and each link's first DHCP exchange is a boot timeline record of its
// own ("DHCP on eth0"), with its error if it got no lease.
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
	links, err := applyLinks(network)
	errs := []error{err, writeHostEntries(network.ExtraHostEntries)}
	res := newResolver(network)
	if len(network.Nameservers) > 0 || len(network.SearchDomains) > 0 {
		errs = append(errs, res.flush())
	}
	n.configs.setResolver(res)
	ctx, cancel := context.WithCancel(context.Background())
	boot.Go("stop DHCP at the shutdown", func() { <-n.stop; cancel() })
	live := &liveLinks{n: n, ctx: ctx, res: res, dhcp: map[string]context.CancelFunc{}}
	leases := live.keepLeases(links)
	n.configs.setLinks(live)
	waitLeases(leases, leaseDeadline)
	return errors.Join(errs...)
}

// liveLinks changes the node's links for a config applied live, and keeps
// one DHCP client on each link that asks for one.
type liveLinks struct {
	n   *node
	ctx context.Context // ends at the shutdown
	res *resolver

	mu   sync.Mutex
	dhcp map[string]context.CancelFunc // by link name
}

// Reconfigure makes the links go from old to new (reconfigureLinks),
// with a DHCP client on each link set up that asks for one and one less on
// each VLAN deleted or that no longer asks.
func (l *liveLinks) Reconfigure(old, new machineconfig.Network) error {
	links, dropped, err := reconfigureLinks(old, new)
	l.keepLeases(links)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, cl := range links {
		if !cl.dhcp {
			dropped = append(dropped, cl.link.Attrs().Name)
		}
	}
	for _, name := range dropped {
		if cancel := l.dhcp[name]; cancel != nil {
			cancel()
			delete(l.dhcp, name)
		}
	}
	return err
}

// keepLeases starts a DHCP client on each of links that asks for one and
// has none; it returns the first exchanges of the clients it started.
func (l *liveLinks) keepLeases(links []configuredLink) []pendingLease {
	l.mu.Lock()
	defer l.mu.Unlock()
	var leases []pendingLease
	for _, cl := range links {
		name := cl.link.Attrs().Name
		if !cl.dhcp || l.dhcp[name] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(l.ctx)
		l.dhcp[name] = cancel
		leases = append(leases, pendingLease{cl.path + " (" + name + ")", l.n.startDHCP(ctx, cl, l.res)})
	}
	return leases
}

// pendingLease is the first DHCP exchange of a link, named for messages.
type pendingLease struct {
	name string
	done <-chan error
}

// waitLeases waits until deadline for the first DHCP exchange on each
// link; their outcome is reported by their own timeline records.
func waitLeases(leases []pendingLease, deadline time.Time) {
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	var pending []string
	for i, l := range leases {
		select {
		case <-l.done:
			continue
		case <-timeout.C:
		}
		// Out of time: note this one and every other still waiting.
		for _, o := range leases[i:] {
			select {
			case <-o.done:
			default:
				pending = append(pending, o.name)
			}
		}
		break
	}
	if len(pending) > 0 {
		slog.Warn("no DHCP lease yet, going on: still asking in the background", "links", strings.Join(pending, ", "), "waited", dhcpBootWait)
	}
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
		// A bond member carries the bond's MAC; the bond keeps the one it had.
		member, _ := a.Slave.(*netlink.BondSlave)
		return ic.Name != "" && a.Name == ic.Name ||
			mac != nil && (bytes.Equal(a.HardwareAddr, mac) || member != nil && bytes.Equal(member.PermHardwareAddr, mac)) ||
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

// startDHCP keeps a lease on l in the background until ctx ends (see
// dhcpClient), asking again after a failed attempt after dhcpRetry,
// doubling up to dhcpRetryMax with jitter. The first exchange's outcome is
// sent on the returned channel and added to the boot timeline as "DHCP on
// <link>".
func (n *node) startDHCP(ctx context.Context, l configuredLink, res *resolver) <-chan error {
	first := make(chan error, 1)
	name := l.link.Attrs().Name
	c := &dhcpClient{link: l.link, res: res, attempt: dhcpTimeout, retry: backoff.Backoff{Initial: dhcpRetry, Max: dhcpRetryMax, Jitter: 0.2}}
	start := boot.SinceBoot()
	boot.Go("DHCP on "+name, func() {
		c.run(ctx, func(err error) {
			r := boot.Record{Name: "DHCP on " + name, Start: start, Duration: boot.SinceBoot() - start}
			if err != nil {
				r.Err = fmt.Sprintf("%s: %v; asking again in the background", l.path, err)
			}
			// On the timeline before the boot, told, goes on.
			n.timeline.Add(r)
			first <- err
		})
	})
	return first
}
