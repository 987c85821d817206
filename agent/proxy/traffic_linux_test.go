package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// These tests send real traffic through the table that a running Proxier
// programs in a network namespace; see env_linux_test.go for the topology.

const (
	webIP   = "198.18.100.10"
	webAddr = webIP + ":80"
)

var (
	httpPort = []discovery.EndpointPort{slicePort("http", v1.ProtocolTCP, 8080)}
	clientIP = netip.MustParseAddr("198.18.0.2")
)

// nodeAddrToward is the node's address on backend i's link: what a
// masqueraded connection to backend i comes from.
func nodeAddrToward(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("198.18.%d.1", 16+i)) }

// getN asks addr over HTTP from ns n times, each on a new connection, and
// returns the replies.
func getN(t *testing.T, ns *netNS, addr string, n int) []reply {
	t.Helper()
	var out []reply
	for range n {
		r, err := httpGet(ns, addr, 2*time.Second)
		if err != nil {
			t.Fatalf("GET http://%s/ from %s: %v", addr, ns.name, err)
		}
		out = append(out, r)
	}
	return out
}

func backendsOf(rs []reply) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		m[r.backend]++
	}
	return m
}

func waitAnswers(t *testing.T, ns *netNS, addr string) {
	t.Helper()
	eventually(t, "http://"+addr+" answers", func() error {
		_, err := httpGet(ns, addr, 300*time.Millisecond)
		return err
	})
}

// webService is a ClusterIP Service "web" on webIP:80 -> named port http.
func webService(mut ...func(*v1.Service)) *v1.Service {
	s := service("web", webIP, svcPort("http", v1.ProtocolTCP, 80, "http"))
	for _, m := range mut {
		m(s)
	}
	return s
}

func TestClusterIPSpreadsOverEndpoints(t *testing.T) {
	e := newEnv(t, 3)
	e.start()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0)), ep(backendIP(1)), ep(backendIP(2))))
	waitAnswers(t, e.client, webAddr)
	seen := backendsOf(getN(t, e.client, webAddr, 40))
	for i := range 3 {
		if seen[fmt.Sprintf("be%d", i)] == 0 {
			t.Errorf("40 connections to the ClusterIP never reached be%d: %v", i, seen)
		}
	}
}

func TestSeveralPortsProtocolsAndNamedTargetPorts(t *testing.T) {
	e := newEnv(t, 1)
	e.start()
	// Service port 80/TCP targets the named port "http" (8080 in the slice);
	// 53/UDP targets "dns" (5353): the numbers come from the slice alone.
	e.apply(
		service("multi", webIP, svcPort("http", v1.ProtocolTCP, 80, "http"), svcPort("dns", v1.ProtocolUDP, 53, "dns")),
		endpointSlice("multi", []discovery.EndpointPort{slicePort("http", v1.ProtocolTCP, 8080), slicePort("dns", v1.ProtocolUDP, 5353)}, ep(backendIP(0))),
	)
	waitAnswers(t, e.client, webAddr)
	r, err := udpAsk(e.client, 0, webIP+":53", 2*time.Second)
	if err != nil {
		t.Fatalf("UDP to %s:53: %v", webIP, err)
	}
	if r.backend != "be0" {
		t.Errorf("UDP %s:53 answered by %q, want be0", webIP, r.backend)
	}
	// TCP 53 is no port of the Service: the ClusterIP rejects it.
	if _, err := httpGet(e.client, webIP+":53", 2*time.Second); !isRefused(err) {
		t.Errorf("TCP to %s:53 (not a Service port) = %v, want connection refused", webIP, err)
	}
}

func TestMasqueradeOnlyFromOutsideTheClusterCIDR(t *testing.T) {
	e := newEnv(t, 2)
	e.start()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)

	// The client is outside 198.18.16.0/20: masqueraded to the node's
	// address toward the endpoint, so the reply comes back through the node.
	r := getN(t, e.client, webAddr, 1)[0]
	if r.from.Addr() != nodeAddrToward(0) {
		t.Errorf("be0 saw the outside client as %v, want the masqueraded %v", r.from.Addr(), nodeAddrToward(0))
	}
	// A pod (be1, inside the cluster CIDR) keeps its own source address.
	r = getN(t, e.backends[1], webAddr, 1)[0]
	if want := netip.MustParseAddr(backendIP(1)); r.from.Addr() != want {
		t.Errorf("be0 saw pod be1 as %v, want its own address %v", r.from.Addr(), want)
	}
}

// TestPodEgress: what a pod sends out of the cluster CIDR leaves with the
// node's address, so the outside can answer; what it sends to another pod
// keeps its own.
func TestPodEgress(t *testing.T) {
	e := newEnv(t, 2)
	e.start()
	serve(t, e.client, "outside")
	r, err := httpGet(e.backends[0], clientIP.String()+":8080", 2*time.Second)
	if err != nil {
		t.Fatalf("pod be0 to the outside: %v", err)
	}
	if want := netip.MustParseAddr(testNodeIP); r.from.Addr() != want {
		t.Errorf("the outside saw pod be0 as %v, want the node's %v", r.from.Addr(), want)
	}
	r, err = httpGet(e.backends[0], backendIP(1)+":8080", 2*time.Second)
	if err != nil {
		t.Fatalf("pod be0 to pod be1: %v", err)
	}
	if want := netip.MustParseAddr(backendIP(0)); r.from.Addr() != want {
		t.Errorf("pod be1 saw pod be0 as %v, want its own address %v", r.from.Addr(), want)
	}
}

func TestHairpin(t *testing.T) {
	e := newEnv(t, 1)
	e.start()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	// be0 reaches its own Service and lands on itself: without masquerade
	// the reply would go straight to itself and never match the connection.
	r, err := httpGet(e.backends[0], webAddr, 2*time.Second)
	if err != nil {
		t.Fatalf("hairpin GET from be0 to its own ClusterIP: %v", err)
	}
	if r.backend != "be0" || r.from.Addr() != nodeAddrToward(0) {
		t.Errorf("hairpin reply = %+v, want be0 seeing the node's %v", r, nodeAddrToward(0))
	}
}

func TestNodePortExternalIPAndLoadBalancer(t *testing.T) {
	e := newEnv(t, 2)
	e.start()
	e.apply(webService(func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalIPs = []string{"198.18.200.5"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.18.200.6"}}
	}), endpointSlice("web", httpPort, ep(backendIP(0)), ep(backendIP(1))))
	for _, addr := range []string{testNodeIP + ":30080", "198.18.200.5:80", "198.18.200.6:80"} {
		waitAnswers(t, e.client, addr)
		rs := getN(t, e.client, addr, 20)
		if seen := backendsOf(rs); seen["be0"] == 0 || seen["be1"] == 0 {
			t.Errorf("20 connections to %s reached %v, want both backends", addr, seen)
		}
		for _, r := range rs {
			if r.from.Addr() == clientIP {
				t.Errorf("%s: %s saw the client's own address; external traffic with policy Cluster is masqueraded", addr, r.backend)
				break
			}
		}
	}
	// The node itself reaches its own NodePort (output hook).
	if r, err := httpGet(e.node, testNodeIP+":30080", 2*time.Second); err != nil {
		t.Errorf("NodePort from the node itself: %v", err)
	} else if r.backend != "be0" && r.backend != "be1" {
		t.Errorf("NodePort from the node itself answered by %q", r.backend)
	}
	// Ports that are no NodePort on the node's address are left alone (no
	// Service rule, no reject): nothing listens, so the node itself refuses.
	if _, err := httpGet(e.client, testNodeIP+":30081", time.Second); !isRefused(err) {
		t.Errorf("connection to a port that is no NodePort = %v, want refused by the node's stack", err)
	}
}

func TestExternalTrafficPolicyLocal(t *testing.T) {
	e := newEnv(t, 2)
	e.start()
	npAddr := testNodeIP + ":30080"
	svc := webService(func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	e.apply(svc, endpointSlice("web", httpPort, ep(backendIP(0), onNode(testNode)), ep(backendIP(1))))
	waitAnswers(t, e.client, npAddr)
	for _, r := range getN(t, e.client, npAddr, 20) {
		if r.backend != "be0" {
			t.Fatalf("NodePort with policy Local reached %s on another node, want only the local be0", r.backend)
		}
		if r.from.Addr() != clientIP {
			t.Fatalf("NodePort with policy Local: be0 saw %v, want the client's own address %v (no masquerade)", r.from, clientIP)
		}
	}
	// The ClusterIP still spreads over the whole cluster.
	if seen := backendsOf(getN(t, e.client, webAddr, 30)); seen["be1"] == 0 {
		t.Errorf("ClusterIP of a Service with externalTrafficPolicy Local reached %v, want be1 too", seen)
	}

	// No local endpoint left: outside traffic to the NodePort is dropped
	// (not rejected: other nodes may serve it), ...
	e.apply(endpointSlice("web", httpPort, ep(backendIP(0), onNode(testNode), notReady()), ep(backendIP(1))))
	eventually(t, "NodePort drop verdict", func() error {
		if !slices.Contains(kernelElements(t, e.node, "no-endpoint-nodeports4"), "tcp . 30080 : drop") {
			return fmt.Errorf("no drop element yet")
		}
		return nil
	})
	if _, err := httpGet(e.client, npAddr, 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("NodePort with policy Local and no local endpoint = %v, want a timeout (dropped)", err)
	}
	// ... but a pod (inside the cluster CIDR) still reaches the Service
	// through the node's address, with Cluster policy.
	r, err := httpGet(e.backends[1], npAddr, 2*time.Second)
	if err != nil || r.backend != "be1" {
		t.Errorf("pod be1 to NodePort with no local endpoint = %+v, %v; want be1 through the cluster chain", r, err)
	}
}

func TestInternalTrafficPolicyLocal(t *testing.T) {
	e := newEnv(t, 2)
	e.start()
	local := ptr(v1.ServiceInternalTrafficPolicyLocal)
	e.apply(webService(func(s *v1.Service) { s.Spec.InternalTrafficPolicy = local }),
		endpointSlice("web", httpPort, ep(backendIP(0), onNode(testNode)), ep(backendIP(1))))
	waitAnswers(t, e.client, webAddr)
	if seen := backendsOf(getN(t, e.client, webAddr, 20)); seen["be0"] != 20 {
		t.Errorf("ClusterIP with internalTrafficPolicy Local reached %v, want be0 (local) only", seen)
	}
	e.apply(endpointSlice("web", httpPort, ep(backendIP(1))))
	eventually(t, "ClusterIP drop verdict", func() error {
		if !slices.Contains(kernelElements(t, e.node, "no-endpoint-services4"), webIP+" . tcp . 80 : drop") {
			return fmt.Errorf("no drop element yet")
		}
		return nil
	})
	if _, err := httpGet(e.client, webAddr, 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("ClusterIP with internalTrafficPolicy Local and only remote endpoints = %v, want a timeout (dropped)", err)
	}
}

func TestNoEndpointsRejects(t *testing.T) {
	e := newEnv(t, 1)
	e.start()
	e.apply(service("dns", webIP, svcPort("http", v1.ProtocolTCP, 80, "http"), svcPort("dns", v1.ProtocolUDP, 53, "dns")))
	eventually(t, "reject verdict", func() error {
		if !slices.Contains(kernelElements(t, e.node, "no-endpoint-services4"), webIP+" . tcp . 80 : goto reject") {
			return fmt.Errorf("no reject element yet")
		}
		return nil
	})
	start := time.Now()
	_, err := httpGet(e.client, webAddr, 3*time.Second)
	if !isRefused(err) || time.Since(start) > time.Second {
		t.Errorf("TCP to a Service with no endpoint = %v after %v, want connection refused at once", err, time.Since(start))
	}
	start = time.Now()
	_, err = udpAsk(e.client, 0, webIP+":53", 3*time.Second)
	if !isRefused(err) || time.Since(start) > time.Second {
		t.Errorf("UDP to a Service with no endpoint = %v after %v, want ICMP port unreachable (refused) at once", err, time.Since(start))
	}
	// The node itself is rejected too (output hook).
	if _, err := httpGet(e.node, webAddr, time.Second); !isRefused(err) {
		t.Errorf("TCP from the node to a Service with no endpoint = %v, want refused", err)
	}
	// Endpoints appear: the same address now answers.
	e.apply(endpointSlice("dns", []discovery.EndpointPort{slicePort("http", v1.ProtocolTCP, 8080), slicePort("dns", v1.ProtocolUDP, 5353)}, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	if _, err := udpAsk(e.client, 0, webIP+":53", 2*time.Second); err != nil {
		t.Errorf("UDP after endpoints appeared: %v", err)
	}
}

func TestTerminatingEndpoints(t *testing.T) {
	e := newEnv(t, 2)
	e.start()
	// No ready endpoint: the serving terminating one takes traffic, the
	// terminating one that no longer serves does not.
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0), terminating(true)), ep(backendIP(1), terminating(false))))
	waitAnswers(t, e.client, webAddr)
	if seen := backendsOf(getN(t, e.client, webAddr, 20)); seen["be0"] != 20 {
		t.Errorf("with only terminating endpoints traffic reached %v, want be0 (serving) only", seen)
	}
	// Nothing serving: reject.
	e.apply(endpointSlice("web", httpPort, ep(backendIP(0), terminating(false))))
	eventually(t, "reject once nothing serves", func() error {
		_, err := httpGet(e.client, webAddr, time.Second)
		if !isRefused(err) {
			return fmt.Errorf("got %v", err)
		}
		return nil
	})
}

func TestSessionAffinity(t *testing.T) {
	e := newEnv(t, 3)
	e.start()
	e.apply(webService(func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](30)}}
	}), endpointSlice("web", httpPort, ep(backendIP(0)), ep(backendIP(1)), ep(backendIP(2))))
	waitAnswers(t, e.client, webAddr)
	if seen := backendsOf(getN(t, e.client, webAddr, 20)); len(seen) != 1 {
		t.Errorf("20 connections from one client with ClientIP affinity reached %v, want one backend", seen)
	}
	// Each pod is a client of its own: affinity is per source address.
	first := map[string]bool{}
	for i := range 3 {
		seen := backendsOf(getN(t, e.backends[i], webAddr, 5))
		if len(seen) != 1 {
			t.Errorf("5 connections from be%d reached %v, want one backend", i, seen)
		}
		for b := range seen {
			first[b] = true
		}
	}
	// Without affinity, the same client spreads again.
	e.apply(webService())
	eventually(t, "affinity off spreads", func() error {
		if seen := backendsOf(getN(t, e.client, webAddr, 20)); len(seen) < 2 {
			return fmt.Errorf("still sticky: %v", seen)
		}
		return nil
	})
	for _, c := range kernelChains(t, e.node) {
		if strings.HasPrefix(c, "aff") {
			t.Errorf("chain %s left after affinity was turned off", c)
		}
	}
}

func TestStaleUDPConntrackFlushed(t *testing.T) {
	e := newEnv(t, 2)
	p, _ := e.start()
	dnsPorts := []discovery.EndpointPort{slicePort("dns", v1.ProtocolUDP, 5353)}
	e.apply(service("dns", webIP, svcPort("dns", v1.ProtocolUDP, 53, "dns")), endpointSlice("dns", dnsPorts, ep(backendIP(0))))
	const sport = 40053
	ask := func() (reply, error) { return udpAsk(e.client, sport, webIP+":53", 300*time.Millisecond) }
	eventually(t, "UDP Service answers", func() error { _, err := ask(); return err })
	if r, _ := ask(); r.backend != "be0" {
		t.Fatalf("UDP answered by %q, want be0", r.backend)
	}
	// be0 leaves the Service (but keeps running). The client's next
	// datagram, from the same port, must not follow the old conntrack
	// entry to be0.
	e.apply(endpointSlice("dns", dnsPorts, ep(backendIP(1))))
	eventually(t, "UDP moves to be1", func() error {
		r, err := ask()
		if err != nil {
			return err
		}
		if r.backend != "be1" {
			return fmt.Errorf("answered by %s", r.backend)
		}
		return nil
	})
	if p.Stats().ConntrackDeleted == 0 {
		t.Errorf("Stats().ConntrackDeleted = 0 after an endpoint went away, want > 0")
	}
}

func TestServiceRemovalRemovesItsRules(t *testing.T) {
	e := newEnv(t, 1)
	e.start()
	before := dumpKernel(t, e.node)
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	e.deleteService("web")
	eventually(t, "Service's chains gone", func() error {
		for _, c := range kernelChains(t, e.node) {
			if strings.Contains(c, "/web/") {
				return fmt.Errorf("chain %s still there", c)
			}
		}
		return nil
	})
	if after := dumpKernel(t, e.node); after != before {
		t.Errorf("table after the Service came and went differs from before it:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if _, err := httpGet(e.client, webAddr, 500*time.Millisecond); err == nil {
		t.Errorf("the removed Service's ClusterIP still answers")
	}
}
