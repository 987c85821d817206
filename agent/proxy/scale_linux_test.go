package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// manyPorts makes n TCP service ports with eps endpoints each; the first
// 2000 are NodePorts.
func manyPorts(n, eps int) []servicePort {
	ports := make([]servicePort, n)
	for i := range ports {
		ports[i] = servicePort{
			name:      servicePortName{Namespace: "scale", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: protoTCP},
			family:    ipv4,
			clusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
			port:      80,
		}
		if i < 2000 {
			ports[i].nodePort = uint16(30000 + i)
		}
		for j := range eps {
			ports[i].endpoints = append(ports[i].endpoints,
				endpoint{addr: netip.AddrFrom4([4]byte{10, byte(1 + j), byte(i >> 8), byte(i)}), port: 8080, ready: true, serving: true})
		}
	}
	return ports
}

// stateOf is the proxier's state for ports, one Service each.
func stateOf(mc modelConfig, ports []servicePort) *state {
	st := newState(mc)
	for i := range ports {
		st.put(ports[i].name.Namespace+"/"+ports[i].name.Name, buildFragment(&mc, ports[i:i+1]))
	}
	return st
}

var scaleConfig = modelConfig{mark: 0x4000, nodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, clusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}

// TestManyServices writes 2000 Services in one full transaction, then
// changes one as a partial sync does: the change must be a transaction on
// that Service's objects, and the table must read back the same as the
// model (element chunking, key encoding), so that a full sync against it
// writes nothing.
func TestManyServices(t *testing.T) {
	needRoot(t)
	ns := newNS(t, "scale")
	n, err := newNFTProgrammer(defaultTable, int(ns.h))
	if err != nil {
		t.Fatal(err)
	}
	ports := manyPorts(2000, 2)
	st := stateOf(scaleConfig, ports)
	want := st.table()
	start := time.Now()
	if err := n.apply(makePlan(nil, want, true)); err != nil {
		t.Fatalf("full sync of 2000 Services: %v", err)
	}
	full := time.Since(start)
	rules, elems := want.counts()

	ports[7].endpoints = ports[7].endpoints[:1]
	before, after, _ := st.change(map[string]*fragment{"scale/svc-7": buildFragment(&scaleConfig, ports[7:8])})
	p := makePlan(before, after, false)
	start = time.Now()
	if err := n.apply(p); err != nil {
		t.Fatalf("partial sync: %v", err)
	}
	partial := time.Since(start)
	t.Logf("2000 Services: %d chains, %d rules, %d elements; full sync %v, one-Service change %v (%d objects touched)",
		len(want.chains), rules, elems, full, partial, len(p.touched()))
	wantTouched := []string{"ext4-scale/svc-7/tcp/http", "hairpin4", "service-ips4", "service-nodeports4", "svc4-scale/svc-7/tcp/http"}
	if got := unsealAll(p.touched()); !slices.Equal(got, wantTouched) {
		t.Errorf("a one-endpoint change touched %v, want %v", got, wantTouched)
	}

	// Read back: a full plan against the kernel is empty.
	changed := stateOf(scaleConfig, ports).table()
	observed, err := n.observe(changed)
	if err != nil {
		t.Fatal(err)
	}
	if fp := makePlan(observed, changed, true); !fp.empty() {
		t.Errorf("the kernel's table differs from the model:\n%s", fp)
	}
}

// BenchmarkProxyTable prints what the table costs in the kernel at 1 000,
// 10 000 and 50 000 (kube-proxy's documented scale) Services of 5
// endpoints (make bench-proxy): a full sync into an empty table, a
// restart's full sync against the table in place (which writes nothing),
// and a change of one endpoint of one Service, each from the model to the
// kernel's acknowledgement.
func BenchmarkProxyTable(b *testing.B) {
	for _, services := range []int{1000, 10000, 50000} {
		b.Run(fmt.Sprint(services), func(b *testing.B) {
			for range b.N {
				benchTable(b, services)
			}
		})
	}
}

func benchTable(b *testing.B, services int) {
	ns := newNS(b, "bench")
	n, err := newNFTProgrammer(defaultTable, int(ns.h))
	if err != nil {
		b.Fatal(err)
	}
	defer n.closeTx()
	ports := manyPorts(services, 5)

	start := time.Now()
	st := stateOf(scaleConfig, ports)
	want := st.table()
	observed, err := n.observe(want)
	if err != nil {
		b.Fatal(err)
	}
	if err := n.apply(makePlan(observed, want, true)); err != nil {
		b.Fatal(err)
	}
	empty := time.Since(start)
	rules, elems := want.counts()

	start = time.Now()
	again := stateOf(scaleConfig, ports).table()
	if observed, err = n.observe(again); err != nil {
		b.Fatal(err)
	}
	rp := makePlan(observed, again, true)
	if !rp.empty() {
		b.Fatalf("a restart against an unchanged table writes:\n%s", rp)
	}
	restart := time.Since(start)

	// The same Service alone in a table beside it: what one change costs
	// where the kernel's check at each commit (it walks every chain the
	// table's base chains reach) has one Service to walk, not all.
	beside, err := newNFTProgrammer(defaultTable+"-beside", int(ns.h))
	if err != nil {
		b.Fatal(err)
	}
	defer beside.closeTx()
	alone := stateOf(scaleConfig, ports[7:8])
	if err := beside.apply(makePlan(newTable(), alone.table(), true)); err != nil {
		b.Fatal(err)
	}

	start = time.Now()
	ports[7].endpoints = append(ports[7].endpoints, endpoint{addr: netip.MustParseAddr("10.200.0.7"), port: 8080, ready: true, serving: true})
	fr := buildFragment(&scaleConfig, ports[7:8])
	before, after, _ := st.change(map[string]*fragment{"scale/svc-7": fr})
	if err := n.apply(makePlan(before, after, false)); err != nil {
		b.Fatal(err)
	}
	change := time.Since(start)

	start = time.Now()
	before, after, _ = alone.change(map[string]*fragment{"scale/svc-7": buildFragment(&scaleConfig, ports[7:8])})
	if err := beside.apply(makePlan(before, after, false)); err != nil {
		b.Fatal(err)
	}
	changeAlone := time.Since(start)

	b.ReportMetric(empty.Seconds(), "empty-s")
	b.ReportMetric(restart.Seconds(), "restart-s")
	b.ReportMetric(float64(change.Microseconds())/1000, "change-ms")
	b.ReportMetric(float64(changeAlone.Microseconds())/1000, "change-alone-ms")
	fmt.Printf("proxy table, %d Services x 5 endpoints (%d chains, %d rules, %d elements): empty table -> programmed %.2fs; restart, unchanged -> nothing written %.2fs; one endpoint added %.1fms (%.1fms to the same Service alone in a table beside it)\n",
		services, len(want.chains), rules, elems, empty.Seconds(), restart.Seconds(), float64(change.Microseconds())/1000, float64(changeAlone.Microseconds())/1000)
}

// BenchmarkPolicyTable prints how long the policy table of policyScale
// takes to program from empty, to program again after a restart (nothing
// to write), and to take one policy's change and one new pod, each as the
// enforcer does it: the table built, planned against the last and written
// in one transaction.
func BenchmarkPolicyTable(b *testing.B) {
	for range b.N {
		ns := newNS(b, "policy")
		n, err := newNFTProgrammer("cairn-policy", int(ns.h))
		if err != nil {
			b.Fatal(err)
		}
		in := policyScale()
		write := func(last *table, full bool) (*table, time.Duration) {
			start := time.Now()
			want, problems := buildPolicyTable(in)
			if len(problems) > 0 {
				b.Fatal(problems)
			}
			if full {
				if last, err = n.observe(want); err != nil {
					b.Fatal(err)
				}
			}
			if err := n.apply(makePlan(last, want, full)); err != nil {
				b.Fatal(err)
			}
			return want, time.Since(start)
		}
		last, empty := write(nil, true)
		_, restart := write(nil, true)
		in.policies[0].Spec.Ingress[0].Ports[1].EndPort = ptr[int32](9200)
		last, change := write(last, false)
		in.pods = append(in.pods, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "ns-1", Labels: map[string]string{"app": "1"}},
			Spec: v1.PodSpec{NodeName: "n2"}, Status: v1.PodStatus{PodIPs: []v1.PodIP{{IP: "10.99.0.1"}}}})
		_, pod := write(last, false)
		n.closeTx()
		rules, elems := last.counts()
		b.ReportMetric(empty.Seconds(), "empty-s")
		b.ReportMetric(float64(change.Microseconds())/1000, "change-ms")
		fmt.Printf("policy table, %d policies, %d pods (%d chains, %d rules, %d elements): empty -> programmed %.2fs; restart, unchanged %.2fs; one policy changed %.1fms; one pod added %.1fms\n",
			len(in.policies), len(in.pods), len(last.chains), rules, elems, empty.Seconds(), restart.Seconds(), float64(change.Microseconds())/1000, float64(pod.Microseconds())/1000)
	}
}

// TestPolicyTableRestart writes a policy table and reads it back as a
// restarted enforcer does: the plan against the kernel's table is empty,
// element keys of every kind included.
func TestPolicyTableRestart(t *testing.T) {
	needRoot(t)
	ns := newNS(t, "policy")
	n, err := newNFTProgrammer("cairn-policy", int(ns.h))
	if err != nil {
		t.Fatal(err)
	}
	defer n.closeTx()
	in := policyScale()
	in.pods, in.policies = in.pods[:500], in.policies[:100]
	want, _ := buildPolicyTable(in)
	observed, err := n.observe(want)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.apply(makePlan(observed, want, true)); err != nil {
		t.Fatal(err)
	}
	again, _ := buildPolicyTable(in)
	if observed, err = n.observe(again); err != nil {
		t.Fatal(err)
	}
	if p := makePlan(observed, again, true); !p.empty() {
		t.Errorf("a restart against an unchanged table writes:\n%s", p)
	}
}
