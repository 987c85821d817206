package stage2

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/internal/backoff"
)

// dhcpMinRetry is the least wait between two requests while renewing or
// rebinding (RFC 2131 4.4.5): half the time left, but not below this.
const dhcpMinRetry = 60 * time.Second

// dhcpRetransmit is the wait before the first retransmission of a DHCP
// message asking for a new lease; each next wait is twice as long.
const dhcpRetransmit = time.Second

// dhcpOptions are asked of the server on top of nclient4's defaults.
var dhcpOptions = dhcpv4.WithRequestedOptions(
	dhcpv4.OptionSubnetMask, dhcpv4.OptionRouter, dhcpv4.OptionDomainNameServer,
	dhcpv4.OptionDNSDomainSearchList, dhcpv4.OptionClasslessStaticRoute,
)

// dhcpClient keeps an IPv4 lease on one link through RFC 2131's states:
// it asks for a lease (INIT), asks its server to extend it at T1
// (RENEWING, unicast), asks any server at T2 (REBINDING, broadcast), and
// when it expires or a server refuses it, removes what the lease set and
// starts over. Every lease it gets is applied to the link, and its DNS
// settings handed to res.
type dhcpClient struct {
	link netlink.Link
	res  *resolver
	// attempt bounds one exchange for a new lease.
	attempt time.Duration
	// retry spaces the attempts at a new lease after one failed.
	retry backoff.Backoff
}

// run keeps a lease until ctx is done; first, if not nil, is told how the
// first attempt went. The link keeps its address when ctx ends: the node
// is going down, and the lease is still the node's until it expires.
func (c *dhcpClient) run(ctx context.Context, first func(error)) {
	name := c.link.Attrs().Name
	failures := 0
	for ctx.Err() == nil {
		lease, err := c.acquire(ctx)
		if err == nil {
			err = c.apply(nil, lease)
		}
		if first != nil {
			first(err)
			first = nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			delay := c.retry.Next()
			slog.Warn("DHCP got no lease, asking again", "link", name, "err", err, "after", delay.Round(time.Millisecond))
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			continue
		}
		if failures > 0 {
			slog.Info("DHCP lease after retrying", "link", name, "attempts", failures+1)
		}
		failures = 0
		c.retry.Reset()
		c.keep(ctx, lease)
	}
}

// acquire asks for a new lease (DISCOVER, OFFER, REQUEST, ACK), for up
// to c.attempt.
func (c *dhcpClient) acquire(ctx context.Context) (*nclient4.Lease, error) {
	name := c.link.Attrs().Name
	// Wait for the link to be up (a cable plugged), as u-root's dhclient.
	if _, err := dhclient.IfUp(name, linkWait); err != nil {
		return nil, fmt.Errorf("DHCP on %s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.attempt)
	defer cancel()
	// The first DISCOVER on a link just brought up is sometimes lost
	// (seen on veth links, one time in three): ask again soon, then at
	// doubling intervals, until c.attempt has passed.
	client, err := nclient4.New(name, nclient4.WithTimeout(dhcpRetransmit), nclient4.WithRetry(math.MaxInt))
	if err != nil {
		return nil, fmt.Errorf("DHCP on %s: %w", name, err)
	}
	defer client.Close()
	lease, err := client.Request(ctx, dhcpOptions)
	if err != nil {
		return nil, fmt.Errorf("DHCP on %s: no lease within %s: %w", name, c.attempt, err)
	}
	return lease, nil
}

// leaseTimes are when a lease is to be renewed (T1), rebound (T2), and
// when it expires; the zero time for a lease that does not.
type leaseTimes struct{ t1, t2, expiry time.Time }

func timesOf(l *nclient4.Lease) leaseTimes {
	d := l.ACK.IPAddressLeaseTime(0)
	if d == 0 || d >= math.MaxUint32*time.Second {
		return leaseTimes{} // infinite, or (against the RFC) unsaid
	}
	// The defaults of RFC 2131 4.4.5, unless the server says otherwise.
	// A server's T1 after its T2, or either after the lease, is taken
	// as the lease's end.
	t2 := min(l.ACK.IPAddressRebindingTime(d*7/8), d)
	t1 := min(l.ACK.IPAddressRenewalTime(d/2), t2)
	return leaseTimes{l.CreationTime.Add(t1), l.CreationTime.Add(t2), l.CreationTime.Add(d)}
}

// keep renews lease until it is lost or ctx is done, applying each new
// lease; a lost lease's settings are removed.
func (c *dhcpClient) keep(ctx context.Context, lease *nclient4.Lease) {
	name := c.link.Attrs().Name
	for {
		t := timesOf(lease)
		if t.expiry.IsZero() {
			<-ctx.Done()
			return
		}
		if !sleepUntil(ctx, t.t1) {
			return
		}
		next, err := c.extend(ctx, lease, t.t2, true)
		if next == nil && !isNak(err) && ctx.Err() == nil {
			slog.Warn("DHCP server does not answer the renewal, rebinding", "link", name, "err", err)
			next, err = c.extend(ctx, lease, t.expiry, false)
		}
		if ctx.Err() != nil {
			return
		}
		if next == nil {
			slog.Warn("DHCP lease lost, asking for a new one", "link", name, "address", dhclient.NewPacket4(c.link, lease.ACK).Lease(), "err", err)
			if err := c.apply(lease, nil); err != nil {
				slog.Warn("remove the lost DHCP lease", "link", name, "err", err)
			}
			return
		}
		if err := c.apply(lease, next); err != nil {
			slog.Warn("apply the renewed DHCP lease", "link", name, "err", err)
		}
		lease = next
	}
}

// isNak reports whether err is a server's refusal (DHCPNAK).
func isNak(err error) bool {
	var nak *nclient4.ErrNak
	return errors.As(err, &nak)
}

// extend asks to extend lease until the deadline: of its own server by
// unicast (RENEWING), or of any server by broadcast (REBINDING). It asks
// again after half the time left, at least dhcpMinRetry apart. It
// returns the extended lease, or nil with why not: the deadline passed,
// ctx ended, or a server refused (DHCPNAK).
func (c *dhcpClient) extend(ctx context.Context, lease *nclient4.Lease, deadline time.Time, unicast bool) (*nclient4.Lease, error) {
	name := c.link.Attrs().Name
	err := errors.New("no answer")
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return nil, err
		}
		wait := min(max(left/2, dhcpMinRetry), left)
		sent := time.Now()
		var next *nclient4.Lease
		next, err = c.request(ctx, lease, wait, unicast)
		if next != nil || isNak(err) {
			return next, err
		}
		slog.Debug("DHCP request unanswered", "link", name, "unicast", unicast, "err", err)
		// A request that failed at once (no socket) is not asked again
		// sooner either.
		if !sleepUntil(ctx, sent.Add(wait)) {
			return nil, err
		}
	}
}

// request sends one DHCPREQUEST extending lease and waits up to wait for
// the answer. It goes from a UDP socket on the link, from the leased
// address, through the kernel as any datagram: to the lease's server
// (unicast), or to every server on the link (broadcast). The answer comes
// to the leased address, a DHCPNAK to the broadcast address (RFC 2131
// 4.1): the socket takes both.
func (c *dhcpClient) request(ctx context.Context, lease *nclient4.Lease, wait time.Duration, unicast bool) (*nclient4.Lease, error) {
	name := c.link.Attrs().Name
	to := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}
	if unicast {
		to.IP = lease.ACK.ServerIdentifier()
	}
	conn, err := server4.NewIPv4UDPConn(name, &net.UDPAddr{Port: dhcpv4.ClientPort})
	if err != nil {
		return nil, fmt.Errorf("DHCP on %s: %w", name, err)
	}
	client, err := nclient4.NewWithConn(conn, c.link.Attrs().HardwareAddr,
		nclient4.WithTimeout(wait), nclient4.WithRetry(1), nclient4.WithServerAddr(to))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("DHCP on %s: %w", name, err)
	}
	defer client.Close()
	sent := time.Now()
	if unicast {
		return client.Renew(ctx, lease, dhcpOptions)
	}
	// Rebinding: any server may answer, so nclient4's Renew (which only
	// takes the lease's server) does not fit.
	req, err := dhcpv4.NewRenewFromAck(lease.ACK, dhcpOptions)
	if err != nil {
		return nil, fmt.Errorf("DHCP on %s: %w", name, err)
	}
	ack, err := client.SendAndRead(ctx, to, req, nclient4.IsMessageType(dhcpv4.MessageTypeAck, dhcpv4.MessageTypeNak))
	if err != nil {
		return nil, err
	}
	if ack.MessageType() == dhcpv4.MessageTypeNak {
		return nil, &nclient4.ErrNak{Offer: lease.Offer, Nak: ack}
	}
	// Renewals go to the server that answered (nclient4's Renew takes
	// only an answer from the server of the lease's offer).
	offer := lease.Offer
	if !ack.ServerIdentifier().Equal(offer.ServerIdentifier()) {
		offer = ack
	}
	return &nclient4.Lease{Offer: offer, ACK: ack, CreationTime: sent}, nil
}

// sleepUntil waits until t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// apply moves the link from lease old's settings to next's: the address
// (with the lease's lifetime, so the kernel drops it at expiry even if
// this client is gone), the routes and the DNS settings. Either may be
// nil: no lease before, or none any more.
func (c *dhcpClient) apply(old, next *nclient4.Lease) error {
	name := c.link.Attrs().Name
	var oldAddr, nextAddr *netlink.Addr
	var oldRoutes, nextRoutes []netlink.Route
	if old != nil {
		oldAddr, oldRoutes = leaseAddr(c.link, old), leaseRoutes(c.link, old.ACK)
	}
	var errs []error
	if next != nil {
		nextAddr, nextRoutes = leaseAddr(c.link, next), leaseRoutes(c.link, next.ACK)
		if err := netlink.AddrReplace(c.link, nextAddr); err != nil {
			return fmt.Errorf("add %s to %s: %w", nextAddr.IPNet, name, err)
		}
	}
	for _, r := range oldRoutes {
		if !slices.ContainsFunc(nextRoutes, func(n netlink.Route) bool { return sameRoute(r, n) }) {
			errs = append(errs, ignoreGone(netlink.RouteDel(&r), "remove route %s from %s", r, name))
		}
	}
	if oldAddr != nil && (nextAddr == nil || !oldAddr.IPNet.IP.Equal(nextAddr.IPNet.IP) || oldAddr.IPNet.Mask.String() != nextAddr.IPNet.Mask.String()) {
		errs = append(errs, ignoreGone(netlink.AddrDel(c.link, oldAddr), "remove %s from %s", oldAddr.IPNet, name))
	}
	for _, r := range nextRoutes {
		if err := netlink.RouteReplace(&r); err != nil {
			errs = append(errs, fmt.Errorf("add route %s to %s: %w", r, name, err))
		}
	}
	var ns []net.IP
	var search []string
	if next != nil {
		ns, search, _ = dhclient.NewPacket4(c.link, next.ACK).GatherDNSSettings()
		slog.Info("DHCP lease", "link", name, "address", nextAddr.IPNet, "until", timesOf(next).expiry.Format(time.RFC3339), "dns", ns, "search", search)
	}
	errs = append(errs, c.res.setLease(name, ns, search))
	return errors.Join(errs...)
}

// ignoreGone wraps err as what failed, unless it says the thing to remove
// is already gone (the kernel expired it, or an operator removed it).
func ignoreGone(err error, format string, args ...any) error {
	if err == nil || errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// leaseAddr is the address a lease gives, valid as long as the lease.
func leaseAddr(link netlink.Link, l *nclient4.Lease) *netlink.Addr {
	addr := &netlink.Addr{IPNet: dhclient.NewPacket4(link, l.ACK).Lease()}
	if exp := timesOf(l).expiry; !exp.IsZero() {
		// Rounded up: the kernel counts whole seconds.
		left := max(int(math.Ceil(time.Until(exp).Seconds())), 1)
		addr.ValidLft, addr.PreferedLft = left, left
	}
	return addr
}

// leaseRoutes are the routes a lease gives: its classless static routes
// (RFC 3442) if any, else a default route through its first router.
func leaseRoutes(link netlink.Link, ack *dhcpv4.DHCPv4) []netlink.Route {
	idx := link.Attrs().Index
	if routes := ack.ClasslessStaticRoute(); routes != nil {
		var out []netlink.Route
		for _, r := range routes {
			route := netlink.Route{LinkIndex: idx, Dst: r.Dest, Gw: r.Router}
			if r.Router == nil || r.Router.IsUnspecified() {
				route.Gw, route.Scope = nil, netlink.SCOPE_LINK
			}
			out = append(out, route)
		}
		return out
	}
	if gw := ack.Router(); len(gw) > 0 {
		return []netlink.Route{{LinkIndex: idx, Gw: gw[0]}}
	}
	return nil
}

func sameRoute(a, b netlink.Route) bool {
	return a.LinkIndex == b.LinkIndex && a.Gw.Equal(b.Gw) && a.Dst.String() == b.Dst.String()
}
