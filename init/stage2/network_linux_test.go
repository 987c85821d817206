package stage2

import (
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/machineconfig"
)

// TestWaitLeasesBounded returns as soon as every lease is in, and at the
// deadline when one never comes.
func TestWaitLeasesBounded(t *testing.T) {
	done := func(err error) <-chan error {
		ch := make(chan error, 1)
		ch <- err
		return ch
	}
	start := time.Now()
	waitLeases([]pendingLease{{"eth0", done(nil)}, {"eth2", done(errors.New("no lease"))}}, start.Add(time.Minute))
	if took := time.Since(start); took > time.Second {
		t.Errorf("waitLeases with every lease in took %s, want it at once", took)
	}
	start = time.Now()
	waitLeases([]pendingLease{{"eth0", make(chan error)}, {"eth2", done(nil)}}, start.Add(200*time.Millisecond))
	if took := time.Since(start); took < 200*time.Millisecond || took > 2*time.Second {
		t.Errorf("waitLeases with a lease that never comes took %s, want the 200ms to the deadline", took)
	}
}

// TestFindLink finds links as configureInterface asks for them, in a
// network namespace of the test's: by name once a driver (here a veth
// link made meanwhile) registers it, by MAC, the first that is not
// loopback, and none, naming the links there are.
func TestFindLink(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWNET) {
		return
	}
	mac, _ := net.ParseMAC("02:00:00:00:10:01")
	added := make(chan error, 1)
	go func() {
		// Meanwhile, as a driver would.
		added <- netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cairn0", HardwareAddr: mac}, PeerName: "cairn1"})
	}()
	start := time.Now()
	l, err := findLink(machineconfig.Interface{Name: "cairn0"}, 10*time.Second)
	if err != nil || l.Attrs().Name != "cairn0" {
		t.Fatalf("findLink(name cairn0) = %v, %v; want the link once added", l, err)
	}
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("findLink took %s to see the link added, want it at once", took)
	}
	l, err = findLink(machineconfig.Interface{MAC: mac.String()}, time.Second)
	if err != nil || l.Attrs().Name != "cairn0" {
		t.Errorf("findLink(mac %s) = %v, %v; want cairn0", mac, l, err)
	}
	// A veth is not a "device": only loopback, which does not count, is.
	_, err = findLink(machineconfig.Interface{}, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "after 200ms") || !strings.Contains(err.Error(), "cairn0 "+mac.String()) || !strings.Contains(err.Error(), "lo ") {
		t.Errorf("findLink(first link) = %v, want no link after 200ms, naming lo and cairn0", err)
	}
}

// TestConfigureNetwork configures a static interface in a network
// namespace of the test's: its MTU, address and route are set, and the
// interface the node lacks is named in the step's error while the other
// is still configured.
func TestConfigureNetwork(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWNET) {
		return
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cairn0"}, PeerName: "cairn1"}); err != nil {
		t.Fatal(err)
	}
	n := newNode(system{}, nil)
	err := n.configureNetwork(machineconfig.Network{Interfaces: []machineconfig.Interface{
		{MAC: "02:00:00:00:99:99"},
		{Name: "cairn0", MTU: 1400, Addresses: []string{"192.0.2.10/24"}, Routes: []machineconfig.Route{{To: "198.51.100.0/24", Via: "192.0.2.1", Metric: 10}}},
	}})
	if err == nil || !strings.Contains(err.Error(), "network.interfaces[0]") || strings.Contains(err.Error(), "network.interfaces[1]") {
		t.Errorf("configureNetwork() = %v, want an error for network.interfaces[0] only", err)
	}
	l, err := netlink.LinkByName("cairn0")
	if err != nil {
		t.Fatal(err)
	}
	if a := l.Attrs(); a.MTU != 1400 || a.Flags&net.FlagUp == 0 {
		t.Errorf("cairn0: mtu %d, flags %v; want mtu 1400 and up", a.MTU, a.Flags)
	}
	addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != "192.0.2.10/24" {
		t.Errorf("cairn0 addresses %v, want 192.0.2.10/24", addrs)
	}
	routes, _ := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: l.Attrs().Index, Dst: mustCIDR(t, "198.51.100.0/24")}, netlink.RT_FILTER_OIF|netlink.RT_FILTER_DST)
	if len(routes) != 1 || routes[0].Gw.String() != "192.0.2.1" || routes[0].Priority != 10 {
		t.Errorf("routes to 198.51.100.0/24 on cairn0: %v, want one via 192.0.2.1, metric 10", routes)
	}
	lo, _ := netlink.LinkByName("lo")
	if lo == nil || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Error("lo is not up")
	}
}

func mustCIDR(t *testing.T, s string) *net.IPNet {
	t.Helper()
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestConfigureNetworkDNS configures a DHCP interface against a real DHCP
// server, in network and mount namespaces of the test's (a tmpfs over
// /etc): the lease's DNS server is used with the config's search domains
// in place of the lease's, the first exchange has its timeline record, and
// the extra host entries follow the node's own lines in /etc/hosts,
// replaced (not added again) when the network is configured again.
func TestConfigureNetworkDNS(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWNET|syscall.CLONE_NEWNS|syscall.CLONE_NEWUTS) {
		return
	}
	if err := unix.Mount("tmpfs", "/etc", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatal(err)
	}
	startTestDHCPServer(t, time.Minute, testLease{ip: net.IPv4(10, 99, 0, 10), dns: net.IPv4(10, 99, 0, 53), search: []string{"lease.example.com"}})
	if err := setHostname("node-1"); err != nil {
		t.Fatal(err)
	}
	n := newNode(system{}, nil)
	defer close(n.stop) // and the DHCP client with it
	network := machineconfig.Network{
		Interfaces:    []machineconfig.Interface{{Name: "cairn0", DHCP: true}},
		SearchDomains: []string{"corp.example.com", "example.com"},
		ExtraHostEntries: []machineconfig.HostEntry{
			{IP: "192.0.2.5", Aliases: []string{"registry.corp.example.com", "registry"}},
			{IP: "2001:db8::5", Aliases: []string{"api.corp.example.com"}},
		},
	}
	if err := n.configureNetwork(network); err != nil {
		t.Fatalf("configureNetwork() = %v", err)
	}
	if got, _ := os.ReadFile(resolvConfPath); string(got) != "search corp.example.com example.com\nnameserver 10.99.0.53\n" {
		t.Errorf("%s = %q, want the config's search domains and the lease's nameserver", resolvConfPath, got)
	}
	records := n.timeline.Records()
	if !slices.ContainsFunc(records, func(r boot.Record) bool { return r.Name == "DHCP on cairn0" && r.Err == "" }) {
		t.Errorf("timeline %+v, want a record DHCP on cairn0 without error", records)
	}
	own := "127.0.0.1 localhost\n::1 localhost\n127.0.1.1 node-1\n"
	want := own + hostsMarker + "192.0.2.5 registry.corp.example.com registry\n2001:db8::5 api.corp.example.com\n"
	if got, _ := os.ReadFile(hostsPath); string(got) != want {
		t.Errorf("%s = %q, want %q", hostsPath, got, want)
	}
	for _, entries := range [][]machineconfig.HostEntry{{{IP: "192.0.2.6", Aliases: []string{"mirror"}}}, nil} {
		if err := writeHostEntries(entries); err != nil {
			t.Fatal(err)
		}
		want := own
		if entries != nil {
			want += hostsMarker + "192.0.2.6 mirror\n"
		}
		if got, _ := os.ReadFile(hostsPath); string(got) != want {
			t.Errorf("after writeHostEntries(%v): %s = %q, want %q", entries, hostsPath, got, want)
		}
	}
}
