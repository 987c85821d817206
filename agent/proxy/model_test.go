package proxy

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got; go test -update rewrites it):\n%s", path, diff)
	}
}

// fixture is a small cluster exercising every feature of the model.
type fixture struct {
	services []*v1.Service
	slices   []*discovery.EndpointSlice
}

func mkService(name string, mutate func(*v1.Service), clusterIPs []string, ports ...v1.ServicePort) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIPs[0], ClusterIPs: clusterIPs, Ports: ports,
		},
	}
	if mutate != nil {
		mutate(s)
	}
	return s
}

func mkSlice(svc, name string, fam discovery.AddressType, ports []discovery.EndpointPort, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: fam, Ports: ports, Endpoints: eps,
	}
}

func mkEP(ip, node string, opts ...epOpt) discovery.Endpoint {
	e := ep(ip, opts...)
	e.NodeName = &node
	return e
}

func (f *fixture) ports(t *testing.T) []servicePort {
	t.Helper()
	var out []servicePort
	for _, s := range f.services {
		var sls []*discovery.EndpointSlice
		for _, sl := range f.slices {
			if sl.Labels[discovery.LabelServiceName] == s.Name {
				sls = append(sls, sl)
			}
		}
		ps, problems := servicePorts(s, sls, "me", "me")
		if len(problems) > 0 {
			t.Fatalf("servicePorts(%s): %v", s.Name, problems)
		}
		out = append(out, ps...)
	}
	return out
}

func tcp(name string, port int32, target string) v1.ServicePort {
	return v1.ServicePort{Name: name, Protocol: v1.ProtocolTCP, Port: port, TargetPort: intstr.Parse(target)}
}

func clusterFixture() *fixture {
	v4 := discovery.AddressTypeIPv4
	return &fixture{
		services: []*v1.Service{
			// Two ports, one with a named target port; mixed endpoint states.
			mkService("web", nil, []string{"10.96.0.10"}, tcp("http", 80, "http"), tcp("metrics", 9090, "9090")),
			// The same port for UDP and TCP.
			mkService("dns", nil, []string{"10.96.0.53"},
				v1.ServicePort{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53},
				v1.ServicePort{Name: "dns-tcp", Protocol: v1.ProtocolTCP, Port: 53}),
			mkService("sig", nil, []string{"10.96.0.7"}, v1.ServicePort{Protocol: v1.ProtocolSCTP, Port: 7777}),
			// NodePort + externalIP + LoadBalancer, externalTrafficPolicy Local.
			mkService("lb", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalIPs = []string{"192.0.2.1"}
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.5"}, {IP: "203.0.113.6", IPMode: ptr(v1.LoadBalancerIPModeProxy)}}
			}, []string{"10.96.0.80"}, tcp("", 80, "8080")),
			// NodePort, Cluster policy.
			mkService("np", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30081
			}, []string{"10.96.0.81"}, tcp("", 80, "8080")),
			// Session affinity.
			mkService("sticky", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
			}, []string{"10.96.0.90"}, tcp("", 80, "8080")),
			// internalTrafficPolicy Local with no local endpoint: drop.
			mkService("itp", func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
			}, []string{"10.96.0.91"}, tcp("", 80, "8080")),
			// No endpoint at all: reject.
			mkService("empty", nil, []string{"10.96.0.92"}, tcp("", 80, "8080")),
			// Only a terminating endpoint that still serves.
			mkService("draining", nil, []string{"10.96.0.93"}, tcp("", 80, "8080")),
			// Dual-stack.
			mkService("dual", nil, []string{"10.96.0.94", "fd00:96::94"}, tcp("", 80, "8080")),
			// Headless and ExternalName: not the proxy's business.
			mkService("headless", nil, []string{"None"}, tcp("", 80, "8080")),
			mkService("ext", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }, []string{""}),
		},
		slices: []*discovery.EndpointSlice{
			mkSlice("web", "web-a", v4, []discovery.EndpointPort{slicePort("http", v1.ProtocolTCP, 8080), slicePort("metrics", v1.ProtocolTCP, 9090)},
				mkEP("10.0.1.2", "me"), mkEP("10.0.2.2", "other"), mkEP("10.0.2.3", "other", notReady()), mkEP("10.0.2.4", "other", terminating(true))),
			mkSlice("dns", "dns-a", v4, []discovery.EndpointPort{slicePort("dns", v1.ProtocolUDP, 53), slicePort("dns-tcp", v1.ProtocolTCP, 53)},
				mkEP("10.0.1.53", "me")),
			mkSlice("sig", "sig-a", v4, []discovery.EndpointPort{slicePort("", v1.ProtocolSCTP, 7777)}, mkEP("10.0.2.7", "other")),
			mkSlice("lb", "lb-a", v4, []discovery.EndpointPort{slicePort("", v1.ProtocolTCP, 8080)}, mkEP("10.0.1.80", "me"), mkEP("10.0.2.80", "other")),
			mkSlice("np", "np-a", v4, []discovery.EndpointPort{slicePort("", v1.ProtocolTCP, 8080)}, mkEP("10.0.2.81", "other")),
			mkSlice("sticky", "sticky-a", v4, []discovery.EndpointPort{slicePort("", v1.ProtocolTCP, 8080)}, mkEP("10.0.1.90", "me"), mkEP("10.0.2.90", "other")),
			mkSlice("itp", "itp-a", v4, []discovery.EndpointPort{slicePort("", v1.ProtocolTCP, 8080)}, mkEP("10.0.2.91", "other")),
			mkSlice("draining", "draining-a", v4, []discovery.EndpointPort{slicePort("", v1.ProtocolTCP, 8080)},
				mkEP("10.0.2.93", "other", terminating(true)), mkEP("10.0.2.94", "other", terminating(false))),
			mkSlice("dual", "dual-4", v4, []discovery.EndpointPort{slicePort("", v1.ProtocolTCP, 8080)}, mkEP("10.0.2.95", "other")),
			mkSlice("dual", "dual-6", discovery.AddressTypeIPv6, []discovery.EndpointPort{slicePort("", v1.ProtocolTCP, 8080)}, mkEP("fd00:2::95", "other")),
		},
	}
}

var testModelConfig = modelConfig{
	clusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("fd00::/48")},
	nodeIPs:      []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00:1::10")},
	mark:         0x4000,
}

// TestModelGolden pins the whole table for a cluster that uses every
// feature; read testdata/cluster.golden as `nft list table inet cairn`.
func TestModelGolden(t *testing.T) {
	golden(t, "cluster", buildTable(testModelConfig, clusterFixture().ports(t)).String())
}

func TestModelEmptyGolden(t *testing.T) {
	golden(t, "empty", buildTable(testModelConfig, nil).String())
}

// TestPacketPathIsConstant checks that the hooks reach Services only
// through map lookups: the fixed chains hold the same rules whatever the
// number of Services.
func TestPacketPathIsConstant(t *testing.T) {
	small := buildTable(testModelConfig, nil)
	big := buildTable(testModelConfig, clusterFixture().ports(t))
	for _, name := range []string{chainNatPrerouting, chainNatOutput, chainNatPostrouting, chainFilterPrerouting, chainFilterOutput, chainServices, chainEndpointsCheck, chainMasquerading} {
		if !small.chains[name].sameRules(big.chains[name]) {
			t.Errorf("chain %s grows with Services:\nempty: %v\nfull:  %v", name, small.chains[name].rules, big.chains[name].rules)
		}
	}
}

func TestCategorize(t *testing.T) {
	local := func(ip string, opts ...epOpt) endpoint {
		return endpoint{addr: netip.MustParseAddr(ip), port: 80, ready: true, serving: true, local: true}
	}
	remote := func(ip string) endpoint {
		return endpoint{addr: netip.MustParseAddr(ip), port: 80, ready: true, serving: true}
	}
	termServing := func(e endpoint) endpoint { e.ready, e.terminating = false, true; return e }
	notServing := func(e endpoint) endpoint { e.ready, e.serving, e.terminating = false, false, true; return e }
	L1, L2, R1, R2 := local("10.0.0.1"), local("10.0.0.2"), remote("10.0.1.1"), remote("10.0.1.2")
	names := func(eps []endpoint) []string {
		var s []string
		for _, e := range eps {
			s = append(s, e.addr.String())
		}
		return s
	}
	tests := []struct {
		name                      string
		sp                        servicePort
		cluster, local, reachable []string
		hasAny                    bool
	}{
		{"cluster policy uses the ready endpoints",
			servicePort{endpoints: []endpoint{L1, R1, notServing(R2)}},
			[]string{"10.0.0.1", "10.0.1.1"}, nil, []string{"10.0.0.1", "10.0.1.1"}, true},
		{"no ready endpoint falls back to serving terminating ones",
			servicePort{endpoints: []endpoint{termServing(R1), notServing(R2)}},
			[]string{"10.0.1.1"}, nil, []string{"10.0.1.1"}, true},
		{"ready endpoints win over terminating ones",
			servicePort{endpoints: []endpoint{termServing(L1), R1}},
			[]string{"10.0.1.1"}, nil, []string{"10.0.1.1"}, true},
		{"no endpoint at all",
			servicePort{endpoints: []endpoint{notServing(R1)}},
			nil, nil, nil, false},
		{"internal Local keeps only local endpoints",
			servicePort{internalLocal: true, endpoints: []endpoint{L1, L2, R1}},
			nil, []string{"10.0.0.1", "10.0.0.2"}, []string{"10.0.0.1", "10.0.0.2"}, true},
		{"internal Local without local endpoints still knows remote ones exist",
			servicePort{internalLocal: true, endpoints: []endpoint{R1}},
			nil, nil, nil, true},
		{"external Local with a NodePort uses both sets",
			servicePort{externalLocal: true, nodePort: 30000, endpoints: []endpoint{L1, R1}},
			[]string{"10.0.0.1", "10.0.1.1"}, []string{"10.0.0.1"}, []string{"10.0.0.1", "10.0.1.1"}, true},
		{"Local falls back to local serving terminating endpoints",
			servicePort{externalLocal: true, nodePort: 30000, endpoints: []endpoint{termServing(L1), R1}},
			[]string{"10.0.1.1"}, []string{"10.0.0.1"}, []string{"10.0.0.1", "10.0.1.1"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, l, r, any := tt.sp.categorize()
			got := [][]string{names(c), names(l), names(r)}
			want := [][]string{tt.cluster, tt.local, tt.reachable}
			if diff := cmp.Diff(want, got); diff != "" || any != tt.hasAny {
				t.Errorf("categorize() = %v hasAny=%v, want %v hasAny=%v", got, any, want, tt.hasAny)
			}
		})
	}
}

func TestServicePorts(t *testing.T) {
	f := clusterFixture()
	ports := f.ports(t)
	byName := map[string]servicePort{}
	for _, p := range ports {
		byName[p.key()] = p
	}
	var names []string
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	wantNames := []string{
		"4-ns/dns/tcp/dns-tcp", "4-ns/dns/udp/dns", "4-ns/draining/tcp/80", "4-ns/dual/tcp/80", "4-ns/empty/tcp/80",
		"4-ns/itp/tcp/80", "4-ns/lb/tcp/80", "4-ns/np/tcp/80", "4-ns/sig/sctp/7777", "4-ns/sticky/tcp/80",
		"4-ns/web/tcp/http", "4-ns/web/tcp/metrics", "6-ns/dual/tcp/80",
	}
	if diff := cmp.Diff(wantNames, names); diff != "" {
		t.Fatalf("service ports (-want +got):\n%s", diff)
	}
	lb := byName["4-ns/lb/tcp/80"]
	if got := lb.externalIPs; !slices.Equal(got, []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("203.0.113.5")}) {
		t.Errorf("lb external IPs = %v, want the externalIP and the VIP-mode ingress IP only", got)
	}
	if !lb.externalLocal || lb.nodePort != 30080 {
		t.Errorf("lb: externalLocal=%v nodePort=%d, want true 30080", lb.externalLocal, lb.nodePort)
	}
	// The named target port "http" comes from the slice: 8080.
	if got := byName["4-ns/web/tcp/http"].endpoints[0].port; got != 8080 {
		t.Errorf("web http endpoint port = %d, want 8080 from the slice", got)
	}
	if got := byName["4-ns/sticky/tcp/80"].affinity; got != time.Minute {
		t.Errorf("sticky affinity = %v, want 1m", got)
	}
	if got := byName["6-ns/dual/tcp/80"].endpoints; len(got) != 1 || got[0].addr != netip.MustParseAddr("fd00:2::95") {
		t.Errorf("dual IPv6 endpoints = %v, want only the IPv6 slice's", got)
	}
}

func TestServicePortsDeprecatedHostnameTopology(t *testing.T) {
	s := mkService("old", nil, []string{"10.96.0.1"}, tcp("", 80, "80"))
	s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
	e := ep("10.0.0.1")
	e.NodeName = nil
	e.DeprecatedTopology = map[string]string{v1.LabelHostname: "host-1"}
	sl := mkSlice("old", "old-a", discovery.AddressTypeIPv4, []discovery.EndpointPort{slicePort("", v1.ProtocolTCP, 80)}, e)
	ps, _ := servicePorts(s, []*discovery.EndpointSlice{sl}, "node-1", "host-1")
	if len(ps) != 1 || !ps[0].endpoints[0].local {
		t.Errorf("an endpoint with hostname topology host-1 is not local to hostname host-1: %+v", ps)
	}
}

func TestServicePortsReportsBadFields(t *testing.T) {
	s := mkService("bad", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.1", "not-an-ip"} }, []string{"10.96.0.1"}, tcp("", 80, "80"))
	ps, problems := servicePorts(s, nil, "n", "n")
	if len(ps) != 1 || len(problems) != 1 || problems[0].field != "spec.externalIPs[1]" || problems[0].reason != reasonInvalidField || !strings.Contains(problems[0].msg, "not-an-ip") {
		t.Errorf("servicePorts with a bad externalIP = %d ports, problems %v; want the port kept and one InvalidServiceField problem on spec.externalIPs[1]", len(ps), problems)
	}
}

// TestServicePortsReportsUnsupportedFields names each field that asks for
// what the table does not do, and only those: the Service's ports are
// programmed all the same.
func TestServicePortsReportsUnsupportedFields(t *testing.T) {
	lb := func(mut func(*v1.Service)) *v1.Service {
		return mkService("lb", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			mut(s)
		}, []string{"10.96.0.5"}, tcp("http", 80, "8080"))
	}
	for _, tt := range []struct {
		name string
		svc  *v1.Service
		want []string // fields
	}{
		{"plain LoadBalancer", lb(func(*v1.Service) {}), nil},
		{"session affinity is supported", lb(func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }), nil},
		{"source ranges", lb(func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24"} }), []string{"spec.loadBalancerSourceRanges"}},
		{"source ranges annotation", lb(func(s *v1.Service) {
			s.Annotations = map[string]string{v1.AnnotationLoadBalancerSourceRangesKey: "192.0.2.0/24"}
		}), []string{"metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]"}},
		{"health check node port", lb(func(s *v1.Service) {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 31000
		}), []string{"spec.healthCheckNodePort"}},
		{"traffic distribution", lb(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferClose) }), []string{"spec.trafficDistribution"}},
		{"topology mode disabled", lb(func(s *v1.Service) { s.Annotations = map[string]string{v1.AnnotationTopologyMode: "Disabled"} }), nil},
		{"topology mode auto", lb(func(s *v1.Service) { s.Annotations = map[string]string{v1.AnnotationTopologyMode: "Auto"} }), []string{"metadata.annotations[service.kubernetes.io/topology-mode]"}},
	} {
		ps, problems := servicePorts(tt.svc, nil, "n", "n")
		var got []string
		for _, p := range problems {
			if p.reason != reasonUnsupportedField {
				t.Errorf("%s: problem %v has reason %s, want %s", tt.name, p, p.reason, reasonUnsupportedField)
			}
			got = append(got, p.field)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: fields reported (-want +got):\n%s", tt.name, diff)
		}
		if len(ps) != 1 || ps[0].nodePort != 30080 {
			t.Errorf("%s: servicePorts = %+v, want the one port programmed with its NodePort", tt.name, ps)
		}
	}
}
