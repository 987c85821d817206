package proxy

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

func fixtureTable(t *testing.T, mutate func(*fixture)) (*table, []servicePort) {
	t.Helper()
	f := clusterFixture()
	if mutate != nil {
		mutate(f)
	}
	ports := f.ports(t)
	return buildTable(testModelConfig, ports), ports
}

func findSlice(f *fixture, name string) *discovery.EndpointSlice {
	for _, s := range f.slices {
		if s.Name == name {
			return s
		}
	}
	panic(name)
}

func findService(f *fixture, name string) *v1.Service {
	for _, s := range f.services {
		if s.Name == name {
			return s
		}
	}
	panic(name)
}

func TestPlanNoChangeIsEmpty(t *testing.T) {
	a, _ := fixtureTable(t, nil)
	b, _ := fixtureTable(t, nil)
	if p := makePlan(a, b, false); !p.empty() {
		t.Errorf("plan between equal tables is not empty:\n%s", p)
	}
}

// TestPlanTouchesOnlyTheChangedService: a change to one slice is written
// as a change to that Service's chains and map elements only.
func TestPlanTouchesOnlyTheChangedService(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*fixture)
		want   []string
	}{
		{"an endpoint joins",
			func(f *fixture) {
				s := findSlice(f, "np-a")
				s.Endpoints = append(s.Endpoints, mkEP("10.0.2.82", "other"))
			},
			[]string{"ext4-ns/np/tcp/80", "hairpin4", "service-ips4", "service-nodeports4", "svc4-ns/np/tcp/80"}},
		{"the only endpoint leaves",
			func(f *fixture) { findSlice(f, "np-a").Endpoints = nil },
			[]string{
				"ext4-ns/np/tcp/80", "hairpin4",
				"no-endpoint-nodeports4", "no-endpoint-services4",
				"service-ips4", "service-nodeports4", "svc4-ns/np/tcp/80"}},
		{"affinity is turned on",
			func(f *fixture) { findService(f, "np").Spec.SessionAffinity = v1.ServiceAffinityClientIP },
			[]string{"aff4-ns/np/tcp/80/10.0.2.81:8080", "ep4-ns/np/tcp/80/10.0.2.81:8080", "ext4-ns/np/tcp/80",
				"service-ips4", "service-nodeports4", "svc4-ns/np/tcp/80"}},
		{"a Service is removed",
			func(f *fixture) {
				f.services = slices.DeleteFunc(f.services, func(s *v1.Service) bool { return s.Name == "sig" })
			},
			[]string{"cluster-ips4", "hairpin4", "service-ips4", "svc4-ns/sig/sctp/7777"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := fixtureTable(t, nil)
			after, _ := fixtureTable(t, tt.mutate)
			p := makePlan(before, after, false)
			if diff := cmp.Diff(tt.want, unsealAll(p.touched())); diff != "" {
				t.Errorf("plan touches (-want +got):\n%s\nplan:\n%s", diff, p)
			}
		})
	}
}

func TestPlanOrdersDeletesBeforeAdds(t *testing.T) {
	before, _ := fixtureTable(t, nil)
	after, _ := fixtureTable(t, func(f *fixture) { findSlice(f, "np-a").Endpoints = nil })
	p := makePlan(before, after, false)
	// The element pointing at the chain goes before the chain.
	if !slices.Contains(p.delElems["service-ips4"], elemKey{addr: netip.MustParseAddr("10.96.0.81"), proto: protoTCP, port: 80}) {
		t.Errorf("plan does not delete the ClusterIP element:\n%s", p)
	}
	if !slices.Contains(unsealAll(p.delChains), "svc4-ns/np/tcp/80") || !slices.Contains(unsealAll(p.flushChains), "svc4-ns/np/tcp/80") {
		t.Errorf("plan does not flush and delete the gone chain:\n%s", p)
	}
	if got := p.addElems["no-endpoint-services4"][elemKey{addr: netip.MustParseAddr("10.96.0.81"), proto: protoTCP, port: 80}]; got != goTo(chainReject) {
		t.Errorf("no-endpoint element = %v, want goto reject", got)
	}
}

// unseal takes the digest out of a sealed chain's name:
// svc4-0123abcd-ns/web/tcp/http -> svc4-ns/web/tcp/http.
func unseal(name string) string {
	kind, rest, ok := strings.Cut(name, "-")
	if _, what, ok2 := strings.Cut(rest, "-"); ok && ok2 && strings.Contains(what, "/") && !strings.Contains(kind, "/") && len(rest)-len(what) == 9 {
		return kind + "-" + what
	}
	return name
}

func unsealAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = unseal(n)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestPlanFullTrustsSealedChains: a full sync compares the kernel's table
// with the model: sealed chains by name, fixed chains by the digests
// their rules carry; it removes what the model lacks and keeps elements
// that are right.
func TestPlanFullTrustsSealedChains(t *testing.T) {
	want, _ := fixtureTable(t, nil)
	observed := newTable()
	var fixed int
	for name, c := range want.chains {
		oc := &chain{name: name, hook: c.hook}
		if !c.sealed {
			fixed++
			for _, r := range c.rules {
				oc.tags = append(oc.tags, ruleTag(r))
			}
		}
		observed.chains[name] = oc
	}
	observed.chains[chainServices].tags = append(observed.chains[chainServices].tags, "junk")
	observed.chains["svc4-ns/gone/tcp/80"] = &chain{name: "svc4-ns/gone/tcp/80"}
	for name, s := range want.sets {
		o := *s
		o.elems = maps.Clone(s.elems)
		observed.sets[name] = &o
	}
	stale := elemKey{addr: netip.MustParseAddr("10.96.9.9"), proto: protoTCP, port: 80}
	observed.sets["service-ips4"].elems[stale] = goTo("svc4-ns/gone/tcp/80")
	observed.sets["aff4-ns/gone/tcp/80/10.0.0.1:80"] = &set{name: "aff4-ns/gone/tcp/80/10.0.0.1:80", key: []keyField{kAddr4}, timeout: 60e9}

	p := makePlan(observed, want, true)
	if len(p.writeRules) != 1 || p.writeRules[0].name != chainServices {
		var names []string
		for _, c := range p.writeRules {
			names = append(names, c.name)
		}
		t.Errorf("full plan rewrites %v, want only %s, whose rules changed (of %d fixed chains)", names, chainServices, fixed)
	}
	if !slices.Equal(p.delChains, []string{"svc4-ns/gone/tcp/80"}) || !slices.Equal(p.delSets, []string{"aff4-ns/gone/tcp/80/10.0.0.1:80"}) {
		t.Errorf("full plan deletes chains %v and sets %v, want only the stale ones", p.delChains, p.delSets)
	}
	if !slices.Equal(p.delElems["service-ips4"], []elemKey{stale}) || len(p.addElems) != 0 || len(p.addSets) != 0 {
		t.Errorf("full plan element changes: delete %v, add %v, sets %d; want only the stale element deleted", p.delElems, p.addElems, len(p.addSets))
	}
}

func TestPlanRecreatesRetypedSetAndItsUsers(t *testing.T) {
	before, _ := fixtureTable(t, nil)
	after, _ := fixtureTable(t, func(f *fixture) {
		findService(f, "sticky").Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = ptr[int32](120)
	})
	p := makePlan(before, after, false)
	got := strings.Join(unsealAll(p.touched()), " ")
	for _, want := range []string{"aff4-ns/sticky/tcp/80/10.0.1.90:8080", "ep4-ns/sticky/tcp/80/10.0.1.90:8080", "svc4-ns/sticky/tcp/80"} {
		if !strings.Contains(got, want) {
			t.Errorf("changing the affinity timeout does not touch %s; plan:\n%s", want, p)
		}
	}
	if !slices.Contains(unsealAll(p.flushChains), "svc4-ns/sticky/tcp/80") {
		t.Errorf("the chain using the recreated set is not flushed first:\n%s", p)
	}
}

func TestStaleFlows(t *testing.T) {
	_, before := fixtureTable(t, nil)
	_, after := fixtureTable(t, func(f *fixture) {
		// dns loses its endpoint; web changes (TCP: no flush).
		findSlice(f, "dns-a").Endpoints = nil
		findSlice(f, "web-a").Endpoints = nil
	})
	nodeIPs := []netip.Addr{netip.MustParseAddr("192.168.1.10")}
	got := staleFlows(portStates(before), portStates(after), nodeIPs)
	var s []string
	for _, f := range got {
		s = append(s, f.String())
	}
	want := []string{"udp 10.96.0.53:53 to 10.0.1.53:53"}
	if diff := cmp.Diff(want, s); diff != "" {
		t.Errorf("staleFlows (-want +got):\n%s", diff)
	}
	// And back: the UDP Service gains endpoints, so un-NATed flows to it go.
	got = staleFlows(portStates(after), portStates(before), nodeIPs)
	s = nil
	for _, f := range got {
		s = append(s, f.String())
	}
	if diff := cmp.Diff([]string{"udp 10.96.0.53:53 not DNATed"}, s); diff != "" {
		t.Errorf("staleFlows when endpoints appear (-want +got):\n%s", diff)
	}
}

func TestFlowFilterMatch(t *testing.T) {
	ap := netip.MustParseAddrPort
	f := flowFilter{
		proto: protoUDP, frontends: []netip.AddrPort{ap("10.96.0.53:53")}, nodePort: 30053,
		nodeIPs: []netip.Addr{netip.MustParseAddr("192.168.1.10")}, endpoint: ap("10.0.1.53:53"),
	}
	tests := []struct {
		fl   flow
		want bool
	}{
		{flow{protoUDP, ap("10.96.0.53:53"), ap("10.0.1.53:53")}, true},
		{flow{protoUDP, ap("192.168.1.10:30053"), ap("10.0.1.53:53")}, true},
		{flow{protoTCP, ap("10.96.0.53:53"), ap("10.0.1.53:53")}, false},
		{flow{protoUDP, ap("10.96.0.53:53"), ap("10.0.1.54:53")}, false},
		{flow{protoUDP, ap("10.96.0.54:53"), ap("10.0.1.53:53")}, false},
		{flow{protoUDP, ap("192.168.1.11:30053"), ap("10.0.1.53:53")}, false},
	}
	for _, tt := range tests {
		if got := f.match(tt.fl); got != tt.want {
			t.Errorf("%v.match(%+v) = %v, want %v", f, tt.fl, got, tt.want)
		}
	}
}
