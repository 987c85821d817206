package stage2

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/nsrun"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/rfc1035label"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/internal/backoff"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/poll"
)

// testLease is what the test's DHCP server hands out.
type testLease struct {
	ip     net.IP
	dns    net.IP
	search []string
	// routes, if any, are sent as classless static routes, else a
	// default route through the server.
	routes []*dhcpv4.Route
}

// testDHCPServer is a DHCP server (insomniacslk/dhcp's server4) in a
// network namespace of its own, at the far end of a veth pair. It has two
// sockets on its link: one for what is broadcast (DISCOVER, INIT's and
// REBINDING's REQUESTs), one for what is sent to its address (RENEWING's
// REQUESTs), each answering only while told to, and counting what comes.
// Like a real server, it refuses (DHCPNAK) to extend an address it no
// longer hands out.
type testDHCPServer struct {
	ip        net.IP
	leaseTime time.Duration

	mu                       sync.Mutex
	lease                    testLease
	answerBcast, answerUcast bool
	// counts of DISCOVERs, and of the REQUESTs extending a lease by how
	// they came: broadcast (REBINDING), unicast (RENEWING).
	discovers, rebinds, renewals int
	// rebindFrom is where the last REBINDING REQUEST came from.
	rebindFrom net.IP
}

func (s *testDHCPServer) set(f func(s *testDHCPServer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *testDHCPServer) count(f func(s *testDHCPServer) int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return f(s)
}

// handler answers what one of the sockets gets.
func (s *testDHCPServer) handler(unicast bool) server4.Handler {
	return func(conn net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var typ dhcpv4.MessageType
		switch m.MessageType() {
		case dhcpv4.MessageTypeDiscover:
			s.discovers++
			typ = dhcpv4.MessageTypeOffer
		case dhcpv4.MessageTypeRequest:
			switch {
			case unicast:
				s.renewals++
			case m.ClientIPAddr.IsUnspecified():
				// INIT's, for a new lease
			default:
				s.rebinds++
				s.rebindFrom = peer.(*net.UDPAddr).IP
			}
			typ = dhcpv4.MessageTypeAck
			if !m.ClientIPAddr.IsUnspecified() && !m.ClientIPAddr.Equal(s.lease.ip) {
				typ = dhcpv4.MessageTypeNak
			}
		default:
			return
		}
		if unicast && !s.answerUcast || !unicast && !s.answerBcast {
			return
		}
		mods := []dhcpv4.Modifier{dhcpv4.WithMessageType(typ), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(s.ip))}
		if typ != dhcpv4.MessageTypeNak {
			mods = append(mods,
				dhcpv4.WithYourIP(s.lease.ip),
				dhcpv4.WithNetmask(net.CIDRMask(24, 32)),
				dhcpv4.WithLeaseTime(uint32(s.leaseTime.Seconds())),
				dhcpv4.WithDNS(s.lease.dns),
				dhcpv4.WithOption(dhcpv4.OptDomainSearch(&rfc1035label.Labels{Labels: s.lease.search})))
			if s.lease.routes != nil {
				mods = append(mods, dhcpv4.WithOption(dhcpv4.OptClasslessStaticRoute(s.lease.routes...)))
			} else {
				mods = append(mods, dhcpv4.WithRouter(s.ip))
			}
		}
		reply, err := dhcpv4.NewReplyFromRequest(m, mods...)
		if err != nil {
			panic(err)
		}
		// To the client's address if it has one, else broadcast; a NAK is
		// always broadcast (RFC 2131 4.1).
		to := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
		if !m.ClientIPAddr.IsUnspecified() && typ != dhcpv4.MessageTypeNak {
			to.IP = m.ClientIPAddr
		}
		conn.WriteTo(reply.ToBytes(), to)
	}
}

// startTestDHCPServer makes a network namespace for the server, a veth
// pair cairn0 (here) and cairn1 (there, 10.99.0.1/24), and serves DHCP on
// cairn1; all of it is removed when the test ends.
func startTestDHCPServer(t *testing.T, leaseTime time.Duration, lease testLease) (*testDHCPServer, netlink.Link) {
	t.Helper()
	var ns netns.NsHandle
	func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer orig.Close()
		if ns, err = netns.New(); err != nil {
			t.Fatal(err)
		}
		if err := netns.Set(orig); err != nil {
			panic(err)
		}
	}()
	t.Cleanup(func() { ns.Close() })
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cairn0"}, PeerName: "cairn1", PeerNamespace: netlink.NsFd(ns)}); err != nil {
		t.Fatal(err)
	}
	link, err := netlink.LinkByName("cairn0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(link) }) // and its peer with it
	s := &testDHCPServer{ip: net.IPv4(10, 99, 0, 1).To4(), leaseTime: leaseTime, lease: lease, answerBcast: true, answerUcast: true}
	nsrun.In(t, ns, func() {
		peer, err := netlink.LinkByName("cairn1")
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := netlink.ParseAddr("10.99.0.1/24")
		if err := netlink.AddrAdd(peer, addr); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(peer); err != nil {
			t.Fatal(err)
		}
		for _, unicast := range []bool{false, true} {
			bind := &net.UDPAddr{Port: dhcpv4.ServerPort}
			if unicast {
				bind.IP = s.ip
			}
			// The sockets stay in the namespace they are made in.
			conn, err := server4.NewIPv4UDPConn("cairn1", bind)
			if err != nil {
				t.Fatal(err)
			}
			srv, err := server4.NewServer("", nil, s.handler(unicast), server4.WithConn(conn))
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve()
			t.Cleanup(func() { srv.Close() })
		}
	})
	return s, link
}

// TestDHCPLeaseKept runs the DHCP client against a real DHCP server with
// a 4 s lease: the lease is renewed with the server by unicast at T1 (the
// address outlives the 4 s the kernel was told at first), a changed lease
// (DNS, search, routes) is applied at its renewal, a new address comes
// after the server refuses the old one, a server that stops answering
// renewals is asked by broadcast at T2 (rebinding), one that stops
// answering at all lets the lease expire: its address, routes and DNS
// servers removed, the client back to asking for a new lease. The client
// stops when told to.
func TestDHCPLeaseKept(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWNET|syscall.CLONE_NEWNS) {
		return
	}
	if err := unix.Mount("tmpfs", "/etc", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatal(err)
	}
	const leaseTime = 4 * time.Second
	srv, link := startTestDHCPServer(t, leaseTime, testLease{ip: net.IPv4(10, 99, 0, 10), dns: net.IPv4(10, 99, 0, 53), search: []string{"corp.example.com"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &dhcpClient{link: link, res: newResolver(machineconfig.Network{}), attempt: 10 * time.Second, retry: backoff.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}}
	first := make(chan error, 1)
	stopped := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(stopped)
		c.run(ctx, func(err error) { first <- err })
	}()
	if err := <-first; err != nil {
		t.Fatalf("first DHCP exchange: %v", err)
	}
	wantState(t, link, "10.99.0.10/24", []string{"default via 10.99.0.1"}, "search corp.example.com\nnameserver 10.99.0.53\n")

	// Renewed by unicast at T1, past the first lease's end.
	poll.Until(t, 3*leaseTime, "two renewals", func() error {
		if n := srv.count(func(s *testDHCPServer) int { return s.renewals }); n < 2 || time.Since(start) < leaseTime+time.Second {
			return fmt.Errorf("%d renewals after %s", n, time.Since(start).Round(time.Millisecond))
		}
		return nil
	})
	wantState(t, link, "10.99.0.10/24", []string{"default via 10.99.0.1"}, "search corp.example.com\nnameserver 10.99.0.53\n")
	if n := srv.count(func(s *testDHCPServer) int { return s.rebinds }); n != 0 {
		t.Errorf("%d broadcast REQUESTs from the leased address, want none: renewals go by unicast while the server answers", n)
	}

	// A renewal brings new DNS settings and routes.
	srv.set(func(s *testDHCPServer) {
		s.lease.dns, s.lease.search = net.IPv4(10, 99, 0, 54), []string{"new.example.com", "example.com"}
		s.lease.routes = []*dhcpv4.Route{
			{Dest: mustCIDR(t, "198.51.100.0/24"), Router: net.IPv4(10, 99, 0, 2)},
			{Dest: mustCIDR(t, "0.0.0.0/0"), Router: net.IPv4(10, 99, 0, 1)},
		}
	})
	poll.Until(t, 2*leaseTime, "the changed lease applied", func() error {
		return checkState(link, "10.99.0.10/24", []string{"198.51.100.0/24 via 10.99.0.2", "default via 10.99.0.1"}, "search new.example.com example.com\nnameserver 10.99.0.54\n")
	})

	// The server hands out another address: it refuses the renewal, and
	// the client takes the new address in place of the old.
	srv.set(func(s *testDHCPServer) { s.lease.ip = net.IPv4(10, 99, 0, 11) })
	poll.Until(t, 2*leaseTime, "the new address in place of the old", func() error {
		return checkState(link, "10.99.0.11/24", []string{"198.51.100.0/24 via 10.99.0.2", "default via 10.99.0.1"}, "search new.example.com example.com\nnameserver 10.99.0.54\n")
	})

	// Renewals unanswered: rebinding by broadcast keeps the lease.
	srv.set(func(s *testDHCPServer) { s.answerUcast = false })
	rebinds := srv.count(func(s *testDHCPServer) int { return s.rebinds })
	poll.Until(t, 3*leaseTime, "two rebinds", func() error {
		if n := srv.count(func(s *testDHCPServer) int { return s.rebinds }); n < rebinds+2 {
			return fmt.Errorf("%d rebinds", n-rebinds)
		}
		return nil
	})
	if err := checkState(link, "10.99.0.11/24", []string{"198.51.100.0/24 via 10.99.0.2", "default via 10.99.0.1"}, "search new.example.com example.com\nnameserver 10.99.0.54\n"); err != nil {
		t.Errorf("after rebinding: %v", err)
	}
	srv.mu.Lock()
	from := srv.rebindFrom
	srv.mu.Unlock()
	if !from.Equal(net.IPv4(10, 99, 0, 11)) {
		t.Errorf("rebinding REQUESTs came from %v, want the leased address 10.99.0.11", from)
	}

	// No answer at all: the lease expires, what it set is removed, and
	// the client asks for a new lease.
	srv.set(func(s *testDHCPServer) { s.answerBcast = false })
	discovers := srv.count(func(s *testDHCPServer) int { return s.discovers })
	poll.Until(t, 2*leaseTime, "the expired lease removed", func() error {
		return checkState(link, "", nil, "")
	})
	poll.Until(t, 2*leaseTime, "a DISCOVER after the expiry", func() error {
		if n := srv.count(func(s *testDHCPServer) int { return s.discovers }); n == discovers {
			return errors.New("none yet")
		}
		return nil
	})

	cancel()
	poll.Until(t, 5*time.Second, "the client stopped", func() error {
		select {
		case <-stopped:
			return nil
		default:
			return errors.New("still running")
		}
	})
}

func wantState(t *testing.T, link netlink.Link, addr string, routes []string, resolvConf string) {
	t.Helper()
	if err := checkState(link, addr, routes, resolvConf); err != nil {
		t.Error(err)
	}
}

// checkState checks link's IPv4 addresses (addr, or none), its routes
// through a gateway, and resolv.conf.
func checkState(link netlink.Link, addr string, routes []string, resolvConf string) error {
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	var got []string
	for _, a := range addrs {
		got = append(got, a.IPNet.String())
	}
	if want := []string{addr}; addr == "" && len(got) != 0 || addr != "" && !slices.Equal(got, want) {
		return fmt.Errorf("addresses of %s: %v, want [%s]", link.Attrs().Name, got, addr)
	}
	list, err := netlink.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	var gotRoutes []string
	for _, r := range list {
		if r.Gw == nil {
			continue
		}
		dst := "default"
		if r.Dst != nil && r.Dst.String() != "0.0.0.0/0" {
			dst = r.Dst.String()
		}
		gotRoutes = append(gotRoutes, dst+" via "+r.Gw.String())
	}
	slices.Sort(gotRoutes)
	routes = slices.Sorted(slices.Values(routes))
	if !slices.Equal(gotRoutes, routes) {
		return fmt.Errorf("routes of %s: %q, want %q", link.Attrs().Name, gotRoutes, routes)
	}
	data, err := os.ReadFile(resolvConfPath)
	if err != nil {
		return err
	}
	if string(data) != resolvConf {
		return fmt.Errorf("%s = %q, want %q", resolvConfPath, data, resolvConf)
	}
	return nil
}

// TestLeaseTimes computes T1, T2 and the expiry of a lease: RFC 2131's
// defaults, the server's, the server's when they make no sense, and none
// for an infinite lease.
func TestLeaseTimes(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		opts       []dhcpv4.Option
		t1, t2, ex time.Duration // from start; all 0 for none
	}{
		{"defaults", []dhcpv4.Option{dhcpv4.OptIPAddressLeaseTime(time.Hour)}, 30 * time.Minute, 52*time.Minute + 30*time.Second, time.Hour},
		{"the server's", []dhcpv4.Option{dhcpv4.OptIPAddressLeaseTime(time.Hour), optTime(dhcpv4.OptionRenewTimeValue, 10*time.Minute), optTime(dhcpv4.OptionRebindingTimeValue, 20*time.Minute)}, 10 * time.Minute, 20 * time.Minute, time.Hour},
		{"past the lease", []dhcpv4.Option{dhcpv4.OptIPAddressLeaseTime(time.Hour), optTime(dhcpv4.OptionRenewTimeValue, 3*time.Hour), optTime(dhcpv4.OptionRebindingTimeValue, 2*time.Hour)}, time.Hour, time.Hour, time.Hour},
		{"infinite", []dhcpv4.Option{dhcpv4.OptIPAddressLeaseTime(math.MaxUint32 * time.Second)}, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ack, err := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeAck))
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range tt.opts {
				ack.UpdateOption(o)
			}
			got := timesOf(&nclient4.Lease{ACK: ack, CreationTime: start})
			at := func(d time.Duration) time.Time {
				if d == 0 {
					return time.Time{}
				}
				return start.Add(d)
			}
			if want := (leaseTimes{at(tt.t1), at(tt.t2), at(tt.ex)}); got != want {
				t.Errorf("timesOf() = %+v, want %+v", got, want)
			}
		})
	}
}

// optTime is a DHCP option holding a time (T1, T2), which dhcpv4 has no
// constructor for.
func optTime(code dhcpv4.OptionCode, d time.Duration) dhcpv4.Option {
	return dhcpv4.Option{Code: code, Value: dhcpv4.Duration(d)}
}
