package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// The test topology: a "node" namespace runs the dataplane and routes
// between a "client" namespace (outside the cluster) and one namespace per
// backend (pods, inside the cluster CIDR 198.18.16.0/20).
//
//	client 198.18.0.2 ──veth── 198.18.0.1 node 198.18.(16+i).1 ──veth── 198.18.(16+i).2 backend i
//
// ClusterIPs are in 198.18.100.0/24 and external IPs in 198.18.200.0/24;
// the client routes 198.18.0.0/15 to the node, so all of them reach it,
// and the node routes them back toward the client as if to a gateway.
//
// The Services and EndpointSlices come from a real kube-apiserver, the
// test/kube cluster that the package's tests share (TestMain), through
// client-go as a user writes them: Services with their ClusterIPs set, in
// the cluster's Service range (testServiceCIDR), and no selector, so that
// the EndpointSlices, which the tests write too, are theirs alone; updates
// and deletions go through the API as well. Each test works in a namespace
// of its own and deletes its Services and slices when it ends, before the
// next test's proxier lists the cluster.
const (
	testNode       = "node-a"
	testNodeIP     = "198.18.0.1"
	testClusterNet = "198.18.16.0/20"
	// testServiceCIDR is the cluster's: dual-stack, IPv4 primary. Its
	// first address, 198.18.100.1, is the kubernetes Service's (which has no
	// endpoints: every test's table rejects it).
	testServiceCIDR = "198.18.100.0/24,fd00:18:100::/112"
)

type testEnv struct {
	t        *testing.T
	node     *netNS
	client   *netNS
	backends []*netNS
	kube     kubernetes.Interface
	// proxyKube, if set, is the proxier's client instead of kube.
	proxyKube kubernetes.Interface
	ns        string // the test's namespace: apply puts every object there
	cfg       Config
}

func backendIP(i int) string { return fmt.Sprintf("198.18.%d.2", 16+i) }

func newEnv(t *testing.T, nBackends int) *testEnv {
	t.Helper()
	needRoot(t)
	c := kube.Shared(t)
	e := &testEnv{t: t, kube: c.Client, ns: c.Namespace()}
	t.Cleanup(e.deleteObjects) // before the namespace's own cleanup
	e.node = newNS(t, "node")
	e.node.sysctl(t, "net.ipv4.ip_forward", "1")
	e.client = newNS(t, "client")
	link(t, e.node, "cl0", testNodeIP+"/24", e.client, "eth0", "198.18.0.2/24")
	ipCmd(t, "-n", e.client.name, "route", "add", "198.18.0.0/15", "via", testNodeIP)
	// The node's routes to Service addresses stand in for a real node's
	// default route: without one, the node's own packets to a ClusterIP
	// would fail routing before the table sees them.
	ipCmd(t, "-n", e.node.name, "route", "add", "198.18.100.0/24", "via", "198.18.0.2")
	ipCmd(t, "-n", e.node.name, "route", "add", "198.18.200.0/24", "via", "198.18.0.2")
	for i := range nBackends {
		b := newNS(t, fmt.Sprintf("be%d", i))
		link(t, e.node, fmt.Sprintf("be%d", i), fmt.Sprintf("198.18.%d.1/24", 16+i), b, "eth0", backendIP(i)+"/24")
		ipCmd(t, "-n", b.name, "route", "add", "198.18.0.0/15", "via", fmt.Sprintf("198.18.%d.1", 16+i))
		serve(t, b, fmt.Sprintf("be%d", i))
		e.backends = append(e.backends, b)
	}
	e.cfg = Config{
		NodeName:        testNode,
		NodeIPs:         []netip.Addr{netip.MustParseAddr(testNodeIP)},
		ClusterCIDRs:    []netip.Prefix{netip.MustParsePrefix(testClusterNet)},
		MinSyncInterval: 10 * time.Millisecond,
		NetNS:           e.node.path,
		Logger:          testLogger(t),
	}
	return e
}

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("PROXY_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// start runs a Proxier until the test ends (or stop is called) and waits for
// its first sync. Cleanup deletes the table after the last proxier stopped.
func (e *testEnv) start() (p *Proxier, stop func()) {
	e.t.Helper()
	p, stop = e.run()
	eventually(e.t, "first sync", func() error {
		if p.Stats().Syncs == 0 {
			return fmt.Errorf("no sync yet (errors: %d)", p.Stats().Errors)
		}
		return nil
	})
	return p, stop
}

// run is start without the wait: for a proxier whose syncs fail.
func (e *testEnv) run() (p *Proxier, stop func()) {
	e.t.Helper()
	client := e.proxyKube
	if client == nil {
		client = e.kube
	}
	p = New(e.cfg, client)
	ctx, cancel := context.WithCancel(context.Background())
	// The informers as the agent has them, shared by the node's parts.
	f := node.NewInformers(client, e.cfg.NodeName)
	services, slices := f.Core().V1().Services(), f.Discovery().V1().EndpointSlices()
	f.Start(ctx.Done())
	done := make(chan error, 1)
	go func() {
		defer f.Shutdown()
		done <- p.Run(ctx, services, slices)
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			e.t.Errorf("Run did not return 10s after its context was cancelled")
		}
	}
	e.t.Cleanup(func() {
		stop()
		if err := New(e.cfg, e.kube).Cleanup(); err != nil {
			e.t.Errorf("Cleanup: %v", err)
		}
	})
	return p, stop
}

func (e *testEnv) ctx() context.Context { return context.Background() }

// apply creates each object in the test's namespace, or replaces it there
// if it exists, as kubectl create or replace would. A Service's status
// (load balancer ingress) is written through its status subresource.
func (e *testEnv) apply(objs ...any) {
	e.t.Helper()
	ctx := e.ctx()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *v1.Service:
			o.Namespace = e.ns
			api := e.kube.CoreV1().Services(e.ns)
			var cur *v1.Service
			if cur, err = api.Get(ctx, o.Name, metav1.GetOptions{}); err == nil {
				o.ResourceVersion = cur.ResourceVersion
				cur, err = api.Update(ctx, o, metav1.UpdateOptions{})
			} else if apierrors.IsNotFound(err) {
				cur, err = api.Create(ctx, o, metav1.CreateOptions{})
			}
			if err == nil && len(cur.Status.LoadBalancer.Ingress)+len(o.Status.LoadBalancer.Ingress) > 0 {
				cur.Status = o.Status
				_, err = api.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			}
		case *discovery.EndpointSlice:
			o.Namespace = e.ns
			api := e.kube.DiscoveryV1().EndpointSlices(e.ns)
			var cur *discovery.EndpointSlice
			if cur, err = api.Get(ctx, o.Name, metav1.GetOptions{}); err == nil {
				o.ResourceVersion = cur.ResourceVersion
				_, err = api.Update(ctx, o, metav1.UpdateOptions{})
			} else if apierrors.IsNotFound(err) {
				_, err = api.Create(ctx, o, metav1.CreateOptions{})
			}
		default:
			e.t.Fatalf("apply %T", o)
		}
		if err != nil {
			e.t.Fatalf("apply %T: %v", o, err)
		}
	}
}

func (e *testEnv) deleteService(name string) {
	e.t.Helper()
	if err := e.kube.CoreV1().Services(e.ns).Delete(e.ctx(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if err := e.kube.DiscoveryV1().EndpointSlices(e.ns).Delete(e.ctx(), name+"-1", metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// deleteObjects deletes the test's Services and EndpointSlices and waits
// until they are gone, so that their ClusterIPs and NodePorts are free and
// the next test's proxier does not see them.
func (e *testEnv) deleteObjects() {
	ctx := e.ctx()
	svcs := e.kube.CoreV1().Services(e.ns)
	sls := e.kube.DiscoveryV1().EndpointSlices(e.ns)
	list, err := svcs.List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Errorf("list Services in %s: %v", e.ns, err)
		return
	}
	for _, s := range list.Items {
		if err := svcs.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			e.t.Errorf("delete Service %s/%s: %v", e.ns, s.Name, err)
		}
	}
	if err := sls.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		e.t.Errorf("delete EndpointSlices in %s: %v", e.ns, err)
	}
	eventually(e.t, "Services and EndpointSlices of "+e.ns+" gone", func() error {
		s, err := svcs.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		l, err := sls.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if n := len(s.Items) + len(l.Items); n > 0 {
			return fmt.Errorf("%d Services and %d EndpointSlices left", len(s.Items), len(l.Items))
		}
		return nil
	})
}

// Object builders.

func service(name, clusterIP string, ports ...v1.ServicePort) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			Ports:      ports,
		},
	}
}

func svcPort(name string, proto v1.Protocol, port int32, target string) v1.ServicePort {
	return v1.ServicePort{Name: name, Protocol: proto, Port: port, TargetPort: intstr.Parse(target)}
}

type epOpt func(*discovery.Endpoint)

func onNode(n string) epOpt { return func(e *discovery.Endpoint) { e.NodeName = &n } }
func notReady() epOpt {
	return func(e *discovery.Endpoint) { e.Conditions.Ready = ptr(false); e.Conditions.Serving = ptr(false) }
}
func terminating(serving bool) epOpt {
	return func(e *discovery.Endpoint) {
		e.Conditions.Ready, e.Conditions.Serving, e.Conditions.Terminating = ptr(false), ptr(serving), ptr(true)
	}
}

func ptr[T any](v T) *T { return &v }

func ep(ip string, opts ...epOpt) discovery.Endpoint {
	e := discovery.Endpoint{Addresses: []string{ip}, Conditions: discovery.EndpointConditions{Ready: ptr(true)}, NodeName: ptr("node-b")}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func slicePort(name string, proto v1.Protocol, port int32) discovery.EndpointPort {
	return discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &port}
}

func endpointSlice(svc string, ports []discovery.EndpointPort, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   svc + "-1",
			Labels: map[string]string{discovery.LabelServiceName: svc},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
}

// Reading the kernel's table back, independently of the proxier.

func nodeConn(t *testing.T, ns *netNS) *nftables.Conn {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.h)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// kernelElements returns the elements of the named static set in the
// node's table, formatted as in the model with chain names unsealed
// ("198.18.100.10 . tcp . 80 : goto svc4-ns/web/tcp/http"); nil if the
// table or set is missing.
func kernelElements(t *testing.T, ns *netNS, setName string) []string {
	t.Helper()
	n, err := newNFTProgrammer(defaultTable, int(ns.h))
	if err != nil {
		t.Fatal(err)
	}
	skel := buildTable(modelConfig{}, nil)
	got, err := n.observe(skel)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := got.sets[setName]
	if !ok {
		return nil
	}
	var out []string
	for k, v := range s.elems {
		e := k.format(skel.sets[setName].key)
		if v.chain != "" {
			v.chain = unseal(v.chain)
		}
		if v != (verdict{}) {
			e += " : " + v.String()
		}
		out = append(out, e)
	}
	sort.Strings(out)
	return out
}

// kernelChains lists the chain names of the node's table.
func kernelChains(t *testing.T, ns *netNS) []string {
	t.Helper()
	chains, err := nodeConn(t, ns).ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range chains {
		if c.Table.Name == defaultTable {
			out = append(out, c.Name)
		}
	}
	sort.Strings(out)
	return out
}

// dumpKernel renders the node's whole table from the kernel: every chain
// with its rules' expressions, every set with its elements. Anonymous maps
// (numgen) are shown inline by content, since the kernel names them by
// allocation order. Dynamic sets show no elements.
func dumpKernel(t *testing.T, ns *netNS) string {
	t.Helper()
	c := nodeConn(t, ns)
	tbl := &nftables.Table{Name: defaultTable, Family: nftables.TableFamilyINet}
	sets, err := c.GetSets(tbl)
	if err != nil {
		t.Fatalf("list sets: %v", err)
	}
	elemsOf := func(s *nftables.Set) string {
		elems, err := c.GetSetElements(s)
		if err != nil {
			t.Fatalf("elements of %s: %v", s.Name, err)
		}
		var out []string
		for _, e := range elems {
			x := fmt.Sprintf("%x", e.Key)
			if e.VerdictData != nil {
				x += fmt.Sprintf(":%d/%s", e.VerdictData.Kind, e.VerdictData.Chain)
			}
			out = append(out, x)
		}
		sort.Strings(out)
		return strings.Join(out, ",")
	}
	anon := map[string]string{}
	var lines []string
	for _, s := range sets {
		if strings.HasPrefix(s.Name, "__") {
			anon[s.Name] = elemsOf(s)
			continue
		}
		l := fmt.Sprintf("set %s map=%v timeout=%v keylen=%d", s.Name, s.IsMap, s.Timeout, s.KeyType.Bytes)
		if !s.HasTimeout {
			l += " {" + elemsOf(s) + "}"
		}
		lines = append(lines, l)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name != defaultTable {
			continue
		}
		l := "chain " + ch.Name
		if ch.Hooknum != nil {
			l += fmt.Sprintf(" type %s hook %d prio %d", ch.Type, *ch.Hooknum, *ch.Priority)
		}
		rules, err := c.GetRules(tbl, ch)
		if err != nil {
			t.Fatalf("rules of %s: %v", ch.Name, err)
		}
		for _, r := range rules {
			var parts []string
			for _, x := range r.Exprs {
				if lk, ok := x.(*expr.Lookup); ok && strings.HasPrefix(lk.SetName, "__") {
					parts = append(parts, fmt.Sprintf("lookup(sreg %d dreg %d {%s})", lk.SourceRegister, lk.DestRegister, anon[lk.SetName]))
					continue
				}
				if lk, ok := x.(*expr.Lookup); ok {
					lk.SetID = 0
				}
				if ds, ok := x.(*expr.Dynset); ok {
					ds.SetID = 0
				}
				parts = append(parts, fmt.Sprintf("%T%+v", x, x))
			}
			l += "\n\t" + strings.Join(parts, " ")
		}
		lines = append(lines, l)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
