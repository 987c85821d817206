package proxy

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// manyPorts makes n TCP service ports with two endpoints each.
func manyPorts(n int) []servicePort {
	ports := make([]servicePort, n)
	for i := range ports {
		ports[i] = servicePort{
			name:      servicePortName{Namespace: "scale", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: protoTCP},
			family:    ipv4,
			clusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
			port:      80,
			nodePort:  uint16(30000 + i%2000),
			endpoints: []endpoint{
				{addr: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), port: 8080, ready: true, serving: true},
				{addr: netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), port: 8080, ready: true, serving: true},
			},
		}
	}
	return ports
}

// TestManyServices writes 2000 Services in one full transaction, then
// changes one: the change must be a small transaction, and the table must
// read back the same as the model (element chunking, key encoding).
func TestManyServices(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 2000 Services")
	}
	needRoot(t)
	ns := newNS(t, "scale")
	n, err := newNFTProgrammer(defaultTable, int(ns.h))
	if err != nil {
		t.Fatal(err)
	}
	mc := modelConfig{mark: 0x4000, nodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, clusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	ports := manyPorts(2000)
	want := buildTable(mc, ports)
	start := time.Now()
	if err := n.apply(makePlan(nil, want, true)); err != nil {
		t.Fatalf("full sync of 2000 Services: %v", err)
	}
	full := time.Since(start)
	rules, elems := want.counts()

	ports[7].endpoints = ports[7].endpoints[:1]
	changed := buildTable(mc, ports)
	p := makePlan(want, changed, false)
	start = time.Now()
	if err := n.apply(p); err != nil {
		t.Fatalf("partial sync: %v", err)
	}
	partial := time.Since(start)
	t.Logf("2000 Services: %d chains, %d rules, %d elements; full sync %v, one-Service change %v (%d objects touched)",
		len(want.chains), rules, elems, full, partial, len(p.touched()))
	if len(p.touched()) > 4 {
		t.Errorf("a one-endpoint change touched %v", p.touched())
	}

	// Read back: a full plan against the kernel has no element to change.
	observed, err := n.observe(changed)
	if err != nil {
		t.Fatal(err)
	}
	fp := makePlan(observed, changed, true)
	if len(fp.delElems) != 0 || len(fp.addElems) != 0 || len(fp.delChains) != 0 || len(fp.addChains) != 0 || len(fp.addSets) != 0 || len(fp.delSets) != 0 {
		t.Errorf("the kernel's table differs from the model:\n%s", fp)
	}
}
