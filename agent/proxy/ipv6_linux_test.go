package proxy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// IPv6 on top of the IPv4 topology: fd00:18::/64 between client and node,
// fd00:18:bI::/64 to backend I (cluster CIDR fd00:18:b0::/44), Services in
// fd00:18:100::/64 (the cluster's IPv6 Service range is fd00:18:100::/112).
const (
	nodeIP6   = "fd00:18::1"
	clientIP6 = "fd00:18::2"
)

func backendIP6(i int) string { return fmt.Sprintf("fd00:18:b%d::2", i) }

func (e *testEnv) addIPv6() {
	t := e.t
	t.Helper()
	e.node.sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	ipCmd(t, "-n", e.node.name, "-6", "addr", "add", nodeIP6+"/64", "dev", "cl0", "nodad")
	ipCmd(t, "-n", e.client.name, "-6", "addr", "add", clientIP6+"/64", "dev", "eth0", "nodad")
	ipCmd(t, "-n", e.client.name, "-6", "route", "add", "fd00:18::/32", "via", nodeIP6)
	ipCmd(t, "-n", e.node.name, "-6", "route", "add", "fd00:18:100::/64", "via", clientIP6)
	for i, b := range e.backends {
		ipCmd(t, "-n", e.node.name, "-6", "addr", "add", fmt.Sprintf("fd00:18:b%d::1/64", i), "dev", fmt.Sprintf("be%d", i), "nodad")
		ipCmd(t, "-n", b.name, "-6", "addr", "add", backendIP6(i)+"/64", "dev", "eth0", "nodad")
		ipCmd(t, "-n", b.name, "-6", "route", "add", "fd00:18::/32", "via", fmt.Sprintf("fd00:18:b%d::1", i))
	}
	e.cfg.NodeIPs = append(e.cfg.NodeIPs, netip.MustParseAddr(nodeIP6))
	e.cfg.ClusterCIDRs = append(e.cfg.ClusterCIDRs, netip.MustParsePrefix("fd00:18:b0::/44"))
}

func TestDualStackService(t *testing.T) {
	e := newEnv(t, 2)
	e.addIPv6()
	e.start()
	svc := service("dual", webIP, svcPort("http", v1.ProtocolTCP, 80, "http"))
	svc.Spec.ClusterIPs = []string{webIP, "fd00:18:100::10"}
	svc.Spec.IPFamilyPolicy = ptr(v1.IPFamilyPolicyRequireDualStack)
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc.Spec.Ports[0].NodePort = 30080
	v6 := endpointSlice("dual", httpPort, ep(backendIP6(0)), ep(backendIP6(1)))
	v6.Name, v6.AddressType = "dual-6", discovery.AddressTypeIPv6
	e.apply(svc, endpointSlice("dual", httpPort, ep(backendIP(0)), ep(backendIP(1))), v6)

	for _, addr := range []string{webAddr, "[fd00:18:100::10]:80", "[" + nodeIP6 + "]:30080"} {
		waitAnswers(t, e.client, addr)
		rs := getN(t, e.client, addr, 20)
		if seen := backendsOf(rs); seen["be0"] == 0 || seen["be1"] == 0 {
			t.Errorf("20 connections to %s reached %v, want both backends", addr, seen)
		}
		for _, r := range rs {
			if strings.HasPrefix(addr, "[") && !r.from.Addr().Is6() {
				t.Errorf("%s: backend saw %v, want an IPv6 source", addr, r.from)
			}
			if a := r.from.Addr(); a == clientIP || a == netip.MustParseAddr(clientIP6) {
				t.Errorf("%s: %s saw the outside client's own address %v, want it masqueraded", addr, r.backend, a)
				break
			}
		}
	}
	// A pod keeps its IPv6 source address on the ClusterIP.
	r, err := httpGet(e.backends[1], "[fd00:18:100::10]:80", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.backend == "be0" && r.from.Addr() != netip.MustParseAddr(backendIP6(1)) {
		t.Errorf("be0 saw pod be1 as %v, want %v", r.from.Addr(), backendIP6(1))
	}

	// The IPv6 side loses its endpoints: IPv6 rejects, IPv4 still works.
	v6.Endpoints = nil
	e.apply(v6)
	eventually(t, "IPv6 ClusterIP rejects", func() error {
		_, err := httpGet(e.client, "[fd00:18:100::10]:80", time.Second)
		if !isRefused(err) {
			return fmt.Errorf("got %v", err)
		}
		return nil
	})
	if _, err := httpGet(e.client, webAddr, 2*time.Second); err != nil {
		t.Errorf("IPv4 ClusterIP after IPv6 lost its endpoints: %v", err)
	}
}
