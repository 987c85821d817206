package proxy

import (
	"net/netip"
	"slices"
	"testing"
)

func onePort(ns, name, clusterIP string, external string, eps ...string) []servicePort {
	sp := servicePort{
		name:      servicePortName{Namespace: ns, Name: name, Port: "http", Protocol: protoTCP},
		family:    ipv4,
		clusterIP: netip.MustParseAddr(clusterIP),
		port:      80,
	}
	if external != "" {
		sp.externalIPs = []netip.Addr{netip.MustParseAddr(external)}
	}
	for _, e := range eps {
		sp.endpoints = append(sp.endpoints, endpoint{addr: netip.MustParseAddr(e), port: 8080, ready: true, serving: true})
	}
	return []servicePort{sp}
}

// TestStateAddressConflict: two Services with the same external IP and
// port: the first keeps it, the second is told, and gets it only once the
// first lets it go and the second is synced again.
func TestStateAddressConflict(t *testing.T) {
	mc := testModelConfig
	st := newState(mc)
	ext := elemKey{addr: netip.MustParseAddr("192.0.2.7"), proto: protoTCP, port: 80}
	owner := func() string {
		v := st.table().sets["service-ips4"].elems[ext]
		return unseal(v.chain)
	}
	if c := st.put("ns/a", buildFragment(&mc, onePort("ns", "a", "10.96.0.1", "192.0.2.7", "10.0.0.1"))); len(c) != 0 {
		t.Fatalf("first claim: conflicts %v", c)
	}
	_, _, conflicts := st.change(map[string]*fragment{"ns/b": buildFragment(&mc, onePort("ns", "b", "10.96.0.2", "192.0.2.7", "10.0.0.2"))})
	if got := conflicts["ns/b"]; len(got) != 1 || got[0].key != ext {
		t.Errorf("second claim: conflicts %v, want the external IP's element", got)
	}
	if got := owner(); got != "ext4-ns/a/tcp/http" {
		t.Errorf("192.0.2.7 . tcp . 80 goes to %q, want a's chain", got)
	}
	if p := conflictProblem(conflicts["ns/b"][0]); p.reason != reasonAddressConflict || p.field != "spec.externalIPs" {
		t.Errorf("problem = %+v", p)
	}
	// a lets go; b, synced again, takes it.
	st.change(map[string]*fragment{"ns/a": nil})
	_, after, conflicts := st.change(map[string]*fragment{"ns/b": buildFragment(&mc, onePort("ns", "b", "10.96.0.2", "192.0.2.7", "10.0.0.2"))})
	if len(conflicts) != 0 {
		t.Errorf("after a is gone: conflicts %v", conflicts)
	}
	if got := unseal(after.sets["service-ips4"].elems[ext].chain); got != "ext4-ns/b/tcp/http" {
		t.Errorf("192.0.2.7 . tcp . 80 goes to %q, want b's chain", got)
	}
}

// TestStateHairpinShared: an endpoint address in two Services stays in
// the hairpin set until neither has it, and a change concerns its
// element only when its presence changes.
func TestStateHairpinShared(t *testing.T) {
	mc := testModelConfig
	st := newState(mc)
	pod := netip.MustParseAddr("10.0.0.9")
	st.put("ns/a", buildFragment(&mc, onePort("ns", "a", "10.96.0.1", "", "10.0.0.9")))
	st.put("ns/b", buildFragment(&mc, onePort("ns", "b", "10.96.0.2", "", "10.0.0.9", "10.0.0.10")))
	hairpin := func(t *table) []netip.Addr {
		var out []netip.Addr
		for k := range t.sets["hairpin4"].elems {
			out = append(out, k.addr)
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return out
	}
	before, after, _ := st.change(map[string]*fragment{"ns/a": nil})
	if p := makePlan(before, after, false); len(p.delElems["hairpin4"]) != 0 || len(p.addElems["hairpin4"]) != 0 {
		t.Errorf("removing a, whose endpoint b has too, changes hairpin4:\n%s", p)
	}
	if got := hairpin(st.table()); !slices.Equal(got, []netip.Addr{pod, netip.MustParseAddr("10.0.0.10")}) {
		t.Errorf("hairpin4 = %v after a went", got)
	}
	before, after, _ = st.change(map[string]*fragment{"ns/b": nil})
	if p := makePlan(before, after, false); len(p.delElems["hairpin4"]) != 2 {
		t.Errorf("removing b, the last with its endpoints, does not delete both pairs:\n%s", p)
	}
	if got := hairpin(st.table()); len(got) != 0 {
		t.Errorf("hairpin4 = %v with no Service", got)
	}
}

// TestStateCounts: the totals kept as Services come, change, conflict and
// go are what the whole table has.
func TestStateCounts(t *testing.T) {
	mc := testModelConfig
	st := newState(mc)
	check := func(when string) {
		t.Helper()
		whole := st.table()
		rules, elems := whole.counts()
		if c, r, e := st.counts(); c != len(whole.chains) || r != rules || e != elems {
			t.Errorf("%s: counts %d chains, %d rules, %d elements; the table has %d, %d, %d", when, c, r, e, len(whole.chains), rules, elems)
		}
	}
	check("empty")
	st.put("ns/a", buildFragment(&mc, onePort("ns", "a", "10.96.0.1", "192.0.2.7", "10.0.0.1", "10.0.0.2")))
	check("one Service")
	st.change(map[string]*fragment{"ns/b": buildFragment(&mc, onePort("ns", "b", "10.96.0.2", "192.0.2.7", "10.0.0.2"))})
	check("a second, whose external IP conflicts")
	st.change(map[string]*fragment{"ns/a": buildFragment(&mc, onePort("ns", "a", "10.96.0.1", "", "10.0.0.1", "10.0.0.2", "10.0.0.3"))})
	check("an endpoint added")
	st.change(map[string]*fragment{"ns/a": nil, "ns/b": nil})
	check("both gone")
}
