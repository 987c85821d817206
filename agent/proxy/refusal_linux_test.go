package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// These tests make the kernel itself refuse a transaction, and read the
// table back from it.

// quiet waits until p has no sync in progress or pending.
func quiet(t *testing.T, p *Proxier) {
	t.Helper()
	eventually(t, "no sync for 100ms", func() error {
		n := p.Stats().Syncs + p.Stats().Errors
		time.Sleep(100 * time.Millisecond)
		if p.Stats().Syncs+p.Stats().Errors != n {
			return errors.New("still syncing")
		}
		return nil
	})
}

func cairnTable() *nftables.Table {
	return &nftables.Table{Name: defaultTable, Family: nftables.TableFamilyINet}
}

// TestRefusedTransactionLeavesTheTableAsItWas deletes, behind the
// proxier's back, a map element that its next change deletes too: the
// kernel answers ENOENT and aborts the whole transaction, which would
// also have flushed and rewritten the Service's chains and added an
// element. The table read back after the failure is, rule for rule, the
// one from before; the retry is a full sync, which reads the kernel's
// table instead of trusting its own idea of it, and converges.
func TestRefusedTransactionLeavesTheTableAsItWas(t *testing.T) {
	e := newEnv(t, 1)
	// The first retry comes MinSyncInterval after the failure: time
	// enough to read the table in between.
	e.cfg.MinSyncInterval = time.Second
	p, _ := e.start()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	quiet(t, p)

	svcChain := "svc4-" + e.ns + "/web/tcp/http"
	old := "198.18.100.10 . tcp . 80 : goto " + svcChain
	if got := kernelElements(t, e.node, "service-ips4"); !slices.Contains(got, old) {
		t.Fatalf("service-ips4 = %q, want %q in it", got, old)
	}
	c := nodeConn(t, e.node)
	key := encodeKey(elemKey{addr: netip.MustParseAddr(webIP), proto: protoTCP, port: 80}, []keyField{kAddr4, kProto, kPort})
	if err := c.SetDeleteElements(&nftables.Set{Name: "service-ips4", Table: cairnTable()}, []nftables.SetElement{{Key: key}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("delete web's element behind the proxier's back: %v", err)
	}
	before := dumpKernel(t, e.node)
	st := p.Stats()

	// web moves to port 81: the plan deletes web . tcp . 80, which is gone.
	e.apply(webService(func(s *v1.Service) { s.Spec.Ports[0].Port = 81 }))
	eventually(t, "the change refused by the kernel", func() error {
		if p.Stats().Errors == st.Errors {
			return fmt.Errorf("no failed sync yet (syncs: %d)", p.Stats().Syncs-st.Syncs)
		}
		return nil
	})
	if diff := cmp.Diff(before, dumpKernel(t, e.node)); diff != "" {
		t.Errorf("the table after the refused transaction differs from before (-before +after):\n%s", diff)
	}
	if n := p.Stats().Syncs; n != st.Syncs {
		t.Fatalf("%d syncs succeeded before the retry was due; the test could not look at the table in between", n-st.Syncs)
	}

	waitAnswers(t, e.client, webIP+":81")
	want := "198.18.100.10 . tcp . 81 : goto " + svcChain
	if got := kernelElements(t, e.node, "service-ips4"); !slices.Contains(got, want) || slices.Contains(got, old) {
		t.Errorf("service-ips4 after the retry = %q, want %q in it and not %q", got, want, old)
	}
	// The kernel has the table before the metrics count the sync.
	eventually(t, "the retry counted", func() error {
		if p.Stats().Syncs == st.Syncs {
			return errors.New("no successful sync yet")
		}
		return nil
	})
	now := p.Stats()
	if now.Errors != st.Errors+1 || now.FullSyncs <= st.FullSyncs {
		t.Errorf("after the refusal: %d failed syncs and %d full syncs, want 1 failure then a full sync", now.Errors-st.Errors, now.FullSyncs-st.FullSyncs)
	}
}

// fillHook registers base chains of a table of its own (ip hook-filler)
// at IPv4 prerouting until the kernel refuses one more with E2BIG: it
// takes at most 1024 functions per hook and namespace. It returns the
// table, which t.Cleanup deletes.
func fillHook(t *testing.T, ns *netNS) *nftables.Table {
	t.Helper()
	tbl := &nftables.Table{Name: "hook-filler", Family: nftables.TableFamilyIPv4}
	t.Cleanup(func() {
		c := nodeConn(t, ns)
		c.DelTable(tbl)
		c.Flush() // gone already if the test deleted it
	})
	n := 0
	for _, batch := range []int{256, 32, 4, 1} {
		for { // until the kernel refuses a batch of this size
			c, err := nftables.New(nftables.WithNetNSFd(int(ns.h)), nftables.WithSockOptions(bigBuffers)) // room for every ack
			if err != nil {
				t.Fatal(err)
			}
			c.AddTable(tbl)
			for i := range batch {
				c.AddChain(&nftables.Chain{
					Name: fmt.Sprintf("c%d", n+i), Table: tbl,
					Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting,
					Priority: nftables.ChainPriorityRef(nftables.ChainPriority(n + i)),
				})
			}
			if err = c.Flush(); err == nil {
				n += batch
				continue
			}
			if !errors.Is(err, unix.E2BIG) {
				t.Fatalf("add %d base chains at prerouting after %d: %v, want success or E2BIG", batch, n, err)
			}
			break
		}
	}
	// Here the kernel has just refused a single one more.
	if n == 0 {
		t.Fatal("the kernel refused the first base chain at prerouting: the hook was full before the test")
	}
	t.Logf("IPv4 prerouting is full after %d more base chains", n)
	return tbl
}

// TestPersistentRefusalIsRetriedWithBackoff starts a proxier on a node
// where it must re-create the base chain filter-prerouting, which someone
// deleted, and where other software has taken every slot of the IPv4
// prerouting hook: the kernel refuses each of its transactions with E2BIG
// for as long as that lasts. Each failure leaves the table as it was (no
// trace of the Service added meanwhile), the retries come further and
// further apart, and once the slots are free again the next retry builds
// the table a fresh start builds.
func TestPersistentRefusalIsRetriedWithBackoff(t *testing.T) {
	e := newEnv(t, 2)
	_, stop := e.start()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	stop()

	// While no proxier runs, a Service is added ...
	const web2 = "198.18.100.20"
	e.apply(service("web2", web2, svcPort("http", v1.ProtocolTCP, 80, "http")), endpointSlice("web2", httpPort, ep(backendIP(1))))
	// ... the table loses a base chain, and the hook it needs fills up.
	c := nodeConn(t, e.node)
	c.DelChain(&nftables.Chain{Name: chainFilterPrerouting, Table: cairnTable()})
	if err := c.Flush(); err != nil {
		t.Fatalf("delete %s: %v", chainFilterPrerouting, err)
	}
	filler := fillHook(t, e.node)
	before := dumpKernel(t, e.node)

	p, stopRun := e.run()
	const watch = 2500 * time.Millisecond
	var fails []time.Time
	for start, n := time.Now(), uint64(0); time.Since(start) < watch; time.Sleep(2 * time.Millisecond) {
		for s := p.Stats().Errors; n < s; n++ {
			fails = append(fails, time.Now())
		}
	}
	if s := p.Stats(); s.Syncs != 0 {
		t.Fatalf("%d syncs succeeded with the prerouting hook full, want none", s.Syncs)
	}
	if diff := cmp.Diff(before, dumpKernel(t, e.node)); diff != "" {
		t.Errorf("the table after %d refused transactions differs from before (-before +after):\n%s", len(fails), diff)
	}
	if strings.Contains(dumpKernel(t, e.node), "/web2/") {
		t.Errorf("web2, written only by refused transactions, is in the table")
	}
	// Backoff: retry k comes at least MinSyncInterval·2^(k-1) after the
	// failure before it (capped at 30s; the jitter only adds up to a
	// fifth): failures at about 0, 10, 30, 70, 150, 310, 630, 1270 and
	// 2550ms, where a retry every MinSyncInterval would fail 250 times.
	if len(fails) < 5 || len(fails) > 12 {
		t.Errorf("%d failed syncs in %v, want 5 to 12 (backoff from %v, doubling)", len(fails), watch, e.cfg.MinSyncInterval)
	}
	for k := 1; k < len(fails); k++ {
		gap := fails[k].Sub(fails[k-1])
		want := min(e.cfg.MinSyncInterval<<(k-1), 30*time.Second)
		// The failures are seen by polling: allow for its lag.
		if gap < want*4/5-5*time.Millisecond {
			t.Errorf("retry %d failed %v after the failure before it, want at least the backoff %v", k, gap, want)
		}
	}

	// The slots come free: the next retry converges.
	c = nodeConn(t, e.node)
	c.DelTable(filler)
	if err := c.Flush(); err != nil {
		t.Fatalf("delete the hook filler: %v", err)
	}
	waitAnswers(t, e.client, web2+":80")
	eventually(t, chainFilterPrerouting+" back", func() error {
		if !slices.Contains(kernelChains(t, e.node), chainFilterPrerouting) {
			return errors.New("not yet")
		}
		return nil
	})
	errs := p.Stats().Errors
	converged := dumpKernel(t, e.node)
	quiet(t, p)
	if p.Stats().Errors != errs {
		t.Errorf("syncs still fail after the table converged")
	}
	stopRun()
	if err := New(e.cfg, e.kube).Cleanup(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if diff := cmp.Diff(dumpKernel(t, e.node), converged); diff != "" {
		t.Errorf("the table after the refusals ended differs from the one a fresh start builds (-fresh +converged):\n%s", diff)
	}
}

// TestRefusedServiceDoesNotBlockTheOthers makes the kernel refuse one
// Service's objects: a set of another type already has the name of its
// affinity set (someone put it there behind the proxier's back). Written
// with other Services in one transaction, it fails them all; the proxier
// writes the Services in parts, so the others are programmed, and the
// refused one gets a Warning Event naming the kernel's error.
func TestRefusedServiceDoesNotBlockTheOthers(t *testing.T) {
	e := newEnv(t, 2)
	// One sync for all the Services below: the next sync is due this long
	// after web's, and they are all written well before then.
	e.cfg.MinSyncInterval = 5 * time.Second
	p, _ := e.start()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	quiet(t, p)

	sp := servicePort{name: servicePortName{Namespace: e.ns, Name: "sticky", Port: "http", Protocol: protoTCP}, family: ipv4}
	aff := sp.endpointName("aff", endpoint{addr: netip.MustParseAddr(backendIP(1)), port: 8080})
	c := nodeConn(t, e.node)
	if err := c.AddSet(&nftables.Set{Name: aff, Table: cairnTable(), ID: nextSetID(), KeyType: nftables.TypeIP6Addr}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("add a set named %s of another type: %v", aff, err)
	}

	sticky := service("sticky", "198.18.100.31", svcPort("http", v1.ProtocolTCP, 80, "http"))
	sticky.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	e.apply(
		service("first", "198.18.100.30", svcPort("http", v1.ProtocolTCP, 80, "http")),
		endpointSlice("first", httpPort, ep(backendIP(0))),
		sticky, endpointSlice("sticky", httpPort, ep(backendIP(1))),
		service("last", "198.18.100.32", svcPort("http", v1.ProtocolTCP, 80, "http")),
		endpointSlice("last", httpPort, ep(backendIP(1))),
	)
	waitAnswers(t, e.client, "198.18.100.30:80")
	waitAnswers(t, e.client, "198.18.100.32:80")
	eventually(t, "an Event on sticky", func() error {
		evs := e.eventsAbout("sticky")
		if len(evs) != 1 {
			return fmt.Errorf("%d Events about sticky, want 1", len(evs))
		}
		if ev := evs[0]; ev.Type != v1.EventTypeWarning || ev.Reason != reasonKernelRefused || !strings.Contains(ev.Message, "add set") {
			return fmt.Errorf("Event %s %s %q, want a Warning %s naming the refused add set", ev.Type, ev.Reason, ev.Message, reasonKernelRefused)
		}
		return nil
	})
	if n := p.Stats().Errors; n != 0 {
		t.Errorf("%d failed syncs, want none: the others were programmed in the same sync", n)
	}
	for _, ch := range kernelChains(t, e.node) {
		if strings.Contains(ch, "/sticky/") {
			t.Errorf("the refused Service has chain %s in the table", ch)
		}
	}
	// The web Service, in the table before, still answers.
	waitAnswers(t, e.client, webAddr)
}
