package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A few Services that together use every kind of chain and map.
func (e *testEnv) applyMixedServices() {
	e.t.Helper()
	e.apply(
		webService(func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		}),
		endpointSlice("web", httpPort, ep(backendIP(0)), ep(backendIP(1))),
		service("np", "198.18.100.11", svcPort("http", v1.ProtocolTCP, 80, "http")),
		endpointSlice("np", httpPort, ep(backendIP(0), onNode(testNode)), ep(backendIP(1))),
		service("dns", "198.18.100.12", svcPort("dns", v1.ProtocolUDP, 53, "dns")),
		endpointSlice("dns", []discovery.EndpointPort{slicePort("dns", v1.ProtocolUDP, 5353)}, ep(backendIP(1))),
		service("empty", "198.18.100.13", svcPort("http", v1.ProtocolTCP, 80, "http")),
	)
	// np becomes a NodePort Service by an update of what the API server
	// made of it.
	np, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx(), "np", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	np.Spec.Type = v1.ServiceTypeNodePort
	np.Spec.Ports[0].NodePort = 30080
	np.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	e.apply(np)
}

// injectJunk writes into the node's table what no model has: a chain, an
// element pointing at it, a dynamic set, and an extra rule in a fixed chain.
func injectJunk(t *testing.T, ns *netNS) {
	t.Helper()
	c := nodeConn(t, ns)
	tbl := &nftables.Table{Name: defaultTable, Family: nftables.TableFamilyINet}
	junk := c.AddChain(&nftables.Chain{Name: "svc4-default/junk/tcp/1", Table: tbl})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: junk, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: &nftables.Chain{Name: chainServices, Table: tbl}, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
	err := c.SetAddElements(&nftables.Set{Name: "service-ips4", Table: tbl}, []nftables.SetElement{{
		Key:         encodeKey(elemKey{addr: netip.MustParseAddr("198.18.100.99"), proto: protoTCP, port: 1}, []keyField{kAddr4, kProto, kPort}),
		VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: junk.Name},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddSet(&nftables.Set{Name: "aff4-default/junk/tcp/1/198.18.16.2:1", Table: tbl, ID: nextSetID(), KeyType: nftables.TypeIPAddr, HasTimeout: true, Dynamic: true, Timeout: time.Minute}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("inject junk into the table: %v", err)
	}
}

func hasJunk(t *testing.T, ns *netNS) bool {
	d := dumpKernel(t, ns)
	return strings.Contains(d, "junk") || strings.Contains(d, "Kind:1 ") // accept verdict
}

func TestRestartConvergesToTheSameTable(t *testing.T) {
	e := newEnv(t, 2)
	_, stop := e.start()
	e.applyMixedServices()
	waitAnswers(t, e.client, webAddr)
	waitAnswers(t, e.client, testNodeIP+":30080")
	first := dumpKernel(t, e.node)
	stop()

	// The table outlives the proxier: Services keep working while the agent
	// restarts.
	if _, err := httpGet(e.client, webAddr, 2*time.Second); err != nil {
		t.Errorf("ClusterIP with the proxier stopped: %v", err)
	}

	// A restarted proxier finds junk and a stale Service in the table...
	injectJunk(t, e.node)
	if !hasJunk(t, e.node) {
		t.Fatalf("junk not in the table")
	}
	_, stop = e.start()
	eventually(t, "junk removed by the first (full) sync", func() error {
		if hasJunk(t, e.node) {
			return fmt.Errorf("junk still there")
		}
		return nil
	})
	if again := dumpKernel(t, e.node); again != first {
		t.Errorf("table after restart differs from before:\nbefore:\n%s\nafter:\n%s", first, again)
	}
	stop()

	// ... and a Service deleted while no proxier ran is gone after restart,
	// leaving exactly the table a fresh start builds.
	e.deleteService("web")
	_, stop = e.start()
	eventually(t, "stale Service removed", func() error {
		for _, c := range kernelChains(t, e.node) {
			if strings.Contains(c, "/web/") {
				return fmt.Errorf("chain %s still there", c)
			}
		}
		return nil
	})
	restarted := dumpKernel(t, e.node)
	stop()
	if err := New(e.cfg, e.kube).Cleanup(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if fresh := dumpKernel(t, e.node); fresh != restarted {
		t.Errorf("restarted table differs from a fresh one:\nrestarted:\n%s\nfresh:\n%s", restarted, fresh)
	}
}

// TestRestartWithAnUnchangedClusterWritesNothing restarts the proxier
// over the table it wrote: its first sync, a full one, compares the
// kernel's table with the model and commits no transaction at all.
func TestRestartWithAnUnchangedClusterWritesNothing(t *testing.T) {
	e := newEnv(t, 2)
	p, stop := e.start()
	e.applyMixedServices()
	waitAnswers(t, e.client, webAddr)
	waitAnswers(t, e.client, testNodeIP+":30080")
	quiet(t, p)
	stop()

	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(64))
	defer mon.Close()
	gens, err := nodeConn(t, e.node).AddGenerationalMonitor(mon)
	if err != nil {
		t.Fatal(err)
	}
	p, _ = e.start()
	eventually(t, "the restarted proxier's first sync", func() error {
		if p.Stats().FullSyncs == 0 {
			return errors.New("no full sync yet")
		}
		return nil
	})
	select {
	case g := <-gens:
		t.Errorf("the restart committed a transaction; it touched:\n%s", strings.Join(touchedBy(g), "\n"))
	case <-time.After(time.Second):
	}
	if _, err := httpGet(e.client, webAddr, 2*time.Second); err != nil {
		t.Errorf("ClusterIP after the restart: %v", err)
	}
}

func TestPeriodicFullResyncRemovesStaleRules(t *testing.T) {
	e := newEnv(t, 1)
	e.cfg.ResyncPeriod = 200 * time.Millisecond
	p, _ := e.start()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	injectJunk(t, e.node)
	full := p.Stats().FullSyncs
	// The stats count a sync once its transaction is in the kernel: the
	// junk may be gone a moment before.
	eventually(t, "junk removed by a periodic full sync", func() error {
		if hasJunk(t, e.node) {
			return fmt.Errorf("junk still there")
		}
		if n := p.Stats().FullSyncs; n <= full {
			return fmt.Errorf("FullSyncs = %d, want more than %d", n, full)
		}
		return nil
	})
	if _, err := httpGet(e.client, webAddr, 2*time.Second); err != nil {
		t.Errorf("Service after full resync: %v", err)
	}
}

// TestChangeIsOneTransactionOnItsOwnObjects watches the kernel's nftables
// events: a change to one EndpointSlice commits one generation, and every
// chain, rule and element in it belongs to that Service.
func TestChangeIsOneTransactionOnItsOwnObjects(t *testing.T) {
	e := newEnv(t, 3)
	p, _ := e.start()
	e.applyMixedServices()
	waitAnswers(t, e.client, webAddr)
	waitAnswers(t, e.client, "198.18.100.11:80")
	// Let every pending sync finish.
	eventually(t, "quiet", func() error {
		n := p.Stats().Syncs
		time.Sleep(100 * time.Millisecond)
		if p.Stats().Syncs != n {
			return fmt.Errorf("still syncing")
		}
		return nil
	})

	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(64))
	defer mon.Close()
	gens, err := nodeConn(t, e.node).AddGenerationalMonitor(mon)
	if err != nil {
		t.Fatal(err)
	}
	// np gains be2.
	e.apply(endpointSlice("np", httpPort, ep(backendIP(0), onNode(testNode)), ep(backendIP(1)), ep(backendIP(2))))
	var g *nftables.MonitorEvents
	select {
	case g = <-gens:
	case <-time.After(5 * time.Second):
		t.Fatal("no nftables transaction within 5s of the change")
	}
	// np's elements: its ClusterIP and NodePort keys, and the hairpin
	// pairs of its endpoints.
	npKeys := []string{
		fmt.Sprintf("element %x", encodeKey(elemKey{addr: netip.MustParseAddr("198.18.100.11"), proto: protoTCP, port: 80}, []keyField{kAddr4, kProto, kPort})),
		fmt.Sprintf("element %x", encodeKey(elemKey{proto: protoTCP, port: 30080}, []keyField{kProto, kPort})),
	}
	for i := range 3 {
		npKeys = append(npKeys, fmt.Sprintf("element %x", encodeKey(elemKey{addr: netip.MustParseAddr(backendIP(i))}, []keyField{kAddr4, kAddr4})))
	}
	touched := touchedBy(g)
	for _, x := range touched {
		if !strings.Contains(x, "/np/") && !slices.Contains(npKeys, x) {
			t.Errorf("the transaction for a change to np touched %q", x)
		}
	}
	if !slices.ContainsFunc(touched, func(x string) bool {
		return strings.HasPrefix(x, "chain svc4-") && strings.HasSuffix(x, "-"+e.ns+"/np/tcp/http")
	}) {
		t.Errorf("the transaction did not add np's new svc chain; it touched:\n%s", strings.Join(touched, "\n"))
	}
	// A change to another Service: the next transaction is its own and has
	// nothing of np's, so no second one followed np's change.
	e.apply(endpointSlice("dns", []discovery.EndpointPort{slicePort("dns", v1.ProtocolUDP, 5353)}, ep(backendIP(1)), ep(backendIP(2))))
	select {
	case g2 := <-gens:
		next := touchedBy(g2)
		if i := slices.IndexFunc(next, func(x string) bool { return strings.Contains(x, "/np/") }); i >= 0 {
			t.Errorf("a second transaction after np's touched %q", next[i])
		}
		if !slices.ContainsFunc(next, func(x string) bool { return strings.Contains(x, "/dns/") }) {
			t.Errorf("the transaction after np's is not dns's; it touched:\n%s", strings.Join(next, "\n"))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no nftables transaction within 5s of dns's change")
	}
	if seen := backendsOf(getN(t, e.client, "198.18.100.11:80", 40)); seen["be2"] == 0 {
		t.Errorf("the new endpoint be2 gets no traffic: %v", seen)
	}
}

// touchedBy names the chains, rules, sets, elements and tables that the
// transaction g touched.
func touchedBy(g *nftables.MonitorEvents) []string {
	var touched []string
	for _, ev := range g.Changes {
		switch d := ev.Data.(type) {
		case *nftables.Chain:
			touched = append(touched, "chain "+d.Name)
		case *nftables.Rule:
			touched = append(touched, "rule in "+d.Chain.Name)
		case *nftables.Set:
			touched = append(touched, "set "+d.Name)
		case []nftables.SetElement:
			for _, el := range d {
				touched = append(touched, fmt.Sprintf("element %x", el.Key))
			}
		case *nftables.Table:
			touched = append(touched, "table "+d.Name)
		}
	}
	return touched
}

func TestCleanupDeletesTheTable(t *testing.T) {
	e := newEnv(t, 1)
	_, stop := e.start()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	stop()
	if err := New(e.cfg, e.kube).Cleanup(); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if _, err := nodeConn(t, e.node).ListTableOfFamily(defaultTable, nftables.TableFamilyINet); err == nil {
		t.Errorf("table inet %s still exists after Cleanup", defaultTable)
	}
	if err := New(e.cfg, e.kube).Cleanup(); err != nil {
		t.Errorf("second Cleanup with no table: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, 1)
	p, _ := e.start()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(p); err != nil {
		t.Fatalf("register the proxier as a collector: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			switch {
			case m.Gauge != nil:
				got[mf.GetName()] = m.Gauge.GetValue()
			case m.Counter != nil:
				got[mf.GetName()] = m.Counter.GetValue()
			case m.Histogram != nil:
				got[mf.GetName()] += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	st := p.Stats()
	for name, want := range map[string]float64{
		"cairn_proxy_rules":        float64(st.Rules),
		"cairn_proxy_set_elements": float64(st.Elements),
		"cairn_proxy_chains":       float64(st.Chains),
	} {
		if got[name] != want || want == 0 {
			t.Errorf("%s = %v, want %v (> 0)", name, got[name], want)
		}
	}
	if got["cairn_proxy_sync_duration_seconds"] < 1 {
		t.Errorf("sync_duration_seconds has %v samples, want at least 1", got["cairn_proxy_sync_duration_seconds"])
	}
	if ts := got["cairn_proxy_last_sync_timestamp_seconds"]; time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("last_sync_timestamp_seconds = %v, want about now", ts)
	}
	if st.LastSync.IsZero() || st.Syncs == 0 {
		t.Errorf("Stats() = %+v, want syncs and a last sync time", st)
	}
}
