package proxy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// protocol is an IP protocol number as nftables' meta l4proto sees it.
type protocol uint8

const (
	protoTCP  protocol = 6
	protoUDP  protocol = 17
	protoSCTP protocol = 132
)

func (p protocol) String() string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	case protoSCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

func protocolOf(p v1.Protocol) (protocol, bool) {
	switch p {
	case v1.ProtocolTCP, "":
		return protoTCP, true
	case v1.ProtocolUDP:
		return protoUDP, true
	case v1.ProtocolSCTP:
		return protoSCTP, true
	}
	return 0, false
}

// family is an IP family; each has its own maps and chains in the table.
type family uint8

const (
	ipv4 family = 4
	ipv6 family = 6
)

var families = []family{ipv4, ipv6}

func familyOf(a netip.Addr) family {
	if a.Is4() {
		return ipv4
	}
	return ipv6
}

// nft is the family's keyword in nft syntax: ip or ip6.
func (f family) nft() string {
	if f == ipv4 {
		return "ip"
	}
	return "ip6"
}

// servicePortName names one port of one Service, as chain names show it:
// namespace/name/protocol/port, where port is the port's name, or its
// number when the Service's only port has no name.
type servicePortName struct {
	Namespace, Name, Port string
	Protocol              protocol
}

func (n servicePortName) String() string {
	return n.Namespace + "/" + n.Name + "/" + n.Protocol.String() + "/" + n.Port
}

// servicePort is one port of one Service in one IP family, with everything
// the model needs to program it.
type servicePort struct {
	name   servicePortName
	family family

	clusterIP netip.Addr // invalid if the Service has none in this family
	port      uint16
	nodePort  uint16 // 0: none
	// externalIPs are spec.externalIPs and the LoadBalancer ingress IPs of
	// this family: traffic to them is "external".
	externalIPs []netip.Addr

	affinity      time.Duration // 0: no session affinity
	internalLocal bool          // internalTrafficPolicy: Local
	externalLocal bool          // externalTrafficPolicy: Local (and externally reachable)

	endpoints []endpoint // sorted by address, then port
}

// key names a service port in one family: 4-default/web/tcp/http.
func (sp *servicePort) key() string { return fmt.Sprintf("%d-%s", sp.family, sp.name) }

type endpoint struct {
	addr        netip.Addr
	port        uint16
	ready       bool
	serving     bool
	terminating bool
	local       bool // on this node
}

func (e endpoint) String() string { return netip.AddrPortFrom(e.addr, e.port).String() }

func (sp *servicePort) externallyAccessible() bool {
	return sp.nodePort != 0 || len(sp.externalIPs) > 0
}

// usesClusterEndpoints tells whether some traffic to sp goes to endpoints
// anywhere in the cluster.
func (sp *servicePort) usesClusterEndpoints() bool {
	return !sp.internalLocal || (sp.externallyAccessible() && !sp.externalLocal)
}

// usesLocalEndpoints tells whether some traffic to sp goes to this node's
// endpoints only.
func (sp *servicePort) usesLocalEndpoints() bool {
	return sp.internalLocal || sp.externalLocal
}

// categorize picks sp's endpoints the way kube-proxy does:
//   - cluster: the ready endpoints; if none is ready, those that are serving
//     and terminating (a best effort not to drop connections during a
//     rollout);
//   - local: this node's ready endpoints, else its serving+terminating ones;
//   - reachable: the union, in sp.endpoints' order;
//   - hasAny: whether any usable endpoint exists anywhere, which decides
//     between reject (none at all) and drop (none for this policy here).
func (sp *servicePort) categorize() (cluster, local, reachable []endpoint, hasAny bool) {
	if sp.usesClusterEndpoints() {
		for _, e := range sp.endpoints {
			if e.ready {
				cluster = append(cluster, e)
			}
		}
		if len(cluster) == 0 {
			for _, e := range sp.endpoints {
				if e.serving && e.terminating {
					cluster = append(cluster, e)
				}
			}
		}
		hasAny = len(cluster) > 0
	}
	if !sp.usesLocalEndpoints() {
		return cluster, nil, cluster, hasAny
	}
	var localReady, localServing bool
	for _, e := range sp.endpoints {
		switch {
		case e.ready:
			hasAny = true
			localReady = localReady || e.local
		case e.serving && e.terminating:
			hasAny = true
			localServing = localServing || e.local
		}
	}
	for _, e := range sp.endpoints {
		if e.local && ((localReady && e.ready) || (!localReady && localServing && e.serving && e.terminating)) {
			local = append(local, e)
		}
	}
	if !sp.usesClusterEndpoints() {
		return nil, local, local, hasAny
	}
	in := func(list []endpoint, e endpoint) bool { return slices.Contains(list, e) }
	for _, e := range sp.endpoints {
		if in(cluster, e) || in(local, e) {
			reachable = append(reachable, e)
		}
	}
	return cluster, local, reachable, hasAny
}

// skipService tells whether a Service is none of the proxy's business:
// headless and ExternalName Services have no virtual IP.
func skipService(svc *v1.Service) bool {
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return true
	}
	return svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == v1.ClusterIPNone
}

const defaultAffinityTimeout = 10800 * time.Second

// Reasons of the Warning Events about a Service's fields.
const (
	// reasonUnsupportedField: the field asks for something this dataplane
	// does not do; the rest of the Service is programmed without it.
	reasonUnsupportedField = "UnsupportedServiceField"
	// reasonInvalidField: the field's value could not be read (an API
	// server validates them, so this is for objects it did not check); the
	// part of the Service that needs it is skipped.
	reasonInvalidField = "InvalidServiceField"
)

// reasonAddressConflict: another Service has the same external IP and
// port, or NodePort; the Service that had it first keeps it.
const reasonAddressConflict = "ServiceAddressConflict"

// reasonKernelRefused: the kernel refused the Service's objects (a limit,
// an unsupported combination); the table keeps what it had for it.
const reasonKernelRefused = "KernelRefused"

// conflictProblem describes an element a Service could not have.
func conflictProblem(e setElem) fieldProblem {
	field, what := "spec.externalIPs", e.key.String()
	if strings.HasPrefix(e.set, mapServiceNodePorts) || strings.HasPrefix(e.set, mapNoEndpointNodePorts) {
		field, what = "spec.ports.nodePort", fmt.Sprintf("%s %d", e.key.proto, e.key.port)
	}
	return fieldProblem{reason: reasonAddressConflict, field: field, msg: what + " not programmed: another Service has it"}
}

// A fieldProblem is a field of a Service that the table does not honour.
type fieldProblem struct {
	reason string // reasonUnsupportedField or reasonInvalidField
	field  string // its path, as in the API: spec.externalIPs[0]
	msg    string // what is done instead
}

func (p fieldProblem) String() string { return p.field + ": " + p.msg }

// unsupportedFields lists what svc asks of a proxy that this one does not
// do: it would otherwise be ignored without a word.
func unsupportedFields(svc *v1.Service) []fieldProblem {
	var out []fieldProblem
	add := func(field, format string, args ...any) {
		out = append(out, fieldProblem{reason: reasonUnsupportedField, field: field, msg: fmt.Sprintf(format, args...)})
	}
	if len(svc.Spec.LoadBalancerSourceRanges) > 0 {
		add("spec.loadBalancerSourceRanges", "%v not enforced: this node accepts traffic to the load balancer IPs from any source", svc.Spec.LoadBalancerSourceRanges)
	} else if r := svc.Annotations[v1.AnnotationLoadBalancerSourceRangesKey]; r != "" {
		add("metadata.annotations["+v1.AnnotationLoadBalancerSourceRangesKey+"]", "%q not enforced: this node accepts traffic to the load balancer IPs from any source", r)
	}
	if svc.Spec.HealthCheckNodePort != 0 {
		add("spec.healthCheckNodePort", "%d not served: a load balancer cannot learn from this node whether it has local endpoints", svc.Spec.HealthCheckNodePort)
	}
	if td := svc.Spec.TrafficDistribution; td != nil && *td != "" {
		add("spec.trafficDistribution", "%q not followed: topology hints are ignored and traffic goes to endpoints anywhere in the cluster", *td)
	} else if m := svc.Annotations[v1.AnnotationTopologyMode]; m != "" && m != "Disabled" {
		add("metadata.annotations["+v1.AnnotationTopologyMode+"]", "%q not followed: topology hints are ignored and traffic goes to endpoints anywhere in the cluster", m)
	}
	return out
}

// servicePorts turns a Service and its EndpointSlices into one servicePort
// per port and IP family. nodeName and hostname decide which endpoints are
// local. Invalid parts (an unparseable IP, an unknown protocol) are skipped
// and fields the dataplane does not implement ignored, each reported in
// problems, so one bad field does not hide a whole Service.
func servicePorts(svc *v1.Service, sls []*discovery.EndpointSlice, nodeName, hostname string) (ports []servicePort, problems []fieldProblem) {
	if skipService(svc) {
		return nil, nil
	}
	invalid := func(field, format string, args ...any) {
		problems = append(problems, fieldProblem{reason: reasonInvalidField, field: field, msg: fmt.Sprintf(format, args...)})
	}
	problems = unsupportedFields(svc)
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	var affinity time.Duration
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		affinity = defaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			affinity = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	var external []netip.Addr
	for i, s := range svc.Spec.ExternalIPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			invalid(fmt.Sprintf("spec.externalIPs[%d]", i), "%q skipped: %v", s, err)
			continue
		}
		external = append(external, a.Unmap())
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy) {
			continue // a proxying load balancer: traffic arrives for the node, not the VIP
		}
		a, err := netip.ParseAddr(ing.IP)
		if err != nil {
			invalid(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), "%q skipped: %v", ing.IP, err)
			continue
		}
		external = append(external, a.Unmap())
	}
	hasNodePorts := svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer
	externallyAccessible := hasNodePorts || len(external) > 0
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	externalLocal := externallyAccessible && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal

	badProto := map[int]bool{}
	for i, s := range clusterIPs {
		cip, err := netip.ParseAddr(s)
		if err != nil {
			invalid(fmt.Sprintf("spec.clusterIPs[%d]", i), "%q skipped: %v", s, err)
			continue
		}
		cip = cip.Unmap()
		fam := familyOf(cip)
		for j, p := range svc.Spec.Ports {
			proto, ok := protocolOf(p.Protocol)
			if !ok {
				if !badProto[j] { // once, not per IP family
					badProto[j] = true
					invalid(fmt.Sprintf("spec.ports[%d].protocol", j), "port %q skipped: unknown protocol %q", p.Name, p.Protocol)
				}
				continue
			}
			portName := p.Name
			if portName == "" {
				portName = strconv.Itoa(int(p.Port))
			}
			sp := servicePort{
				name:          servicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: portName, Protocol: proto},
				family:        fam,
				clusterIP:     cip,
				port:          uint16(p.Port),
				affinity:      affinity,
				internalLocal: internalLocal,
				externalLocal: externalLocal,
			}
			if hasNodePorts {
				sp.nodePort = uint16(p.NodePort)
			}
			for _, a := range external {
				if familyOf(a) == fam {
					sp.externalIPs = append(sp.externalIPs, a)
				}
			}
			sp.endpoints = endpointsFor(sls, fam, p.Name, proto, nodeName, hostname)
			ports = append(ports, sp)
		}
	}
	return ports, problems
}

// endpointsFor collects, from all of a Service's slices of family fam, the
// endpoints of the slice port named portName. The EndpointSlice controller
// has already resolved a named targetPort to each endpoint's number, so the
// port number comes from the slice, never from the Service.
func endpointsFor(sls []*discovery.EndpointSlice, fam family, portName string, proto protocol, nodeName, hostname string) []endpoint {
	seen := map[netip.AddrPort]bool{}
	var eps []endpoint
	for _, sl := range sls {
		if (fam == ipv4 && sl.AddressType != discovery.AddressTypeIPv4) || (fam == ipv6 && sl.AddressType != discovery.AddressTypeIPv6) {
			continue
		}
		var port uint16
		for _, p := range sl.Ports {
			pp := protoTCP
			if p.Protocol != nil {
				var ok bool
				if pp, ok = protocolOf(*p.Protocol); !ok {
					continue
				}
			}
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if name == portName && pp == proto && p.Port != nil && *p.Port > 0 && *p.Port < 65536 {
				port = uint16(*p.Port)
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil || familyOf(a.Unmap()) != fam {
				continue
			}
			a = a.Unmap()
			ap := netip.AddrPortFrom(a, port)
			if seen[ap] {
				continue
			}
			seen[ap] = true
			c := ep.Conditions
			e := endpoint{addr: a, port: port}
			e.ready = c.Ready == nil || *c.Ready
			e.serving = e.ready
			if c.Serving != nil {
				e.serving = *c.Serving
			}
			e.terminating = c.Terminating != nil && *c.Terminating
			if ep.NodeName != nil {
				e.local = *ep.NodeName == nodeName
			} else if h, ok := ep.DeprecatedTopology[v1.LabelHostname]; ok {
				e.local = h == hostname
			}
			eps = append(eps, e)
		}
	}
	slices.SortFunc(eps, func(a, b endpoint) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		return cmp.Compare(a.port, b.port)
	})
	return eps
}
