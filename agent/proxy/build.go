package proxy

import (
	"fmt"
	"net/netip"
	"strings"
)

// Names of the table's fixed chains.
const (
	chainNatPrerouting    = "nat-prerouting"
	chainNatOutput        = "nat-output"
	chainNatPostrouting   = "nat-postrouting"
	chainFilterPrerouting = "filter-prerouting"
	chainFilterOutput     = "filter-output"
	chainServices         = "services"
	chainMasquerading     = "masquerading"
	chainPodEgress        = "pod-egress"
	chainEndpointsCheck   = "endpoints-check"
	chainReject           = "reject"
)

// Names of the table's fixed sets and maps, one of each per family (the
// family's number is appended: service-ips4, service-ips6).
const (
	mapServiceIPs          = "service-ips"           // addr . proto . port : goto the Service's chain
	mapServiceNodePorts    = "service-nodeports"     // proto . port : goto the Service's external chain
	setNodePortIPs         = "nodeport-ips"          // the node's addresses that serve NodePorts
	mapNoEndpointServices  = "no-endpoint-services"  // addr . proto . port : reject or drop
	mapNoEndpointNodePorts = "no-endpoint-nodeports" // proto . port : reject or drop
	setClusterIPs          = "cluster-ips"           // every ClusterIP: other ports are rejected
	setHairpin             = "hairpin"               // endpoint . endpoint: a packet DNATed back to its sender
)

func famName(base string, f family) string { return fmt.Sprintf("%s%d", base, f) }

// Priorities: DNAT at dstnat (-100); the endpoint check just after it, so
// it sees only packets that no Service rule rewrote; masquerade at srcnat.
const (
	prioDstNAT    = -100
	prioSrcNAT    = 100
	prioFilterPre = -90
)

// modelConfig is the node-specific input of the model.
type modelConfig struct {
	clusterCIDRs []netip.Prefix
	nodeIPs      []netip.Addr
	masqAll      bool
	mark         uint32
}

func (c *modelConfig) cidrs(f family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range c.clusterCIDRs {
		if familyOf(p.Addr()) == f {
			out = append(out, p.Masked())
		}
	}
	return out
}

// podEgress masquerades what pods send out of the cluster's pod networks
// (as ip-masq-agent does): the outside, the node's own network included,
// cannot route replies to pod addresses. Traffic between pods, on this
// node or others, keeps its pod source address. Without cluster CIDRs
// nothing is known to be a pod, and nothing is masqueraded.
func podEgress(mc modelConfig) []rule {
	var rules []rule
	for _, f := range families {
		for _, p := range mc.cidrs(f) {
			rules = append(rules, rule{tDaddrNet{f, p, false}, tVerdict{verdict{kind: vReturn}}})
		}
	}
	for _, f := range families {
		for _, p := range mc.cidrs(f) {
			rules = append(rules, rule{tSaddr{f, p, false}, sMasquerade{}})
		}
	}
	return rules
}

// fixedTable is the table without Services: the hooks, the chains they
// reach, and the shared sets and maps, empty but for the node's own
// addresses.
func fixedTable(mc modelConfig) *table {
	t := newTable()
	mark := mc.mark

	t.addChain(chainNatPrerouting, &hook{"nat", "prerouting", prioDstNAT}, rule{tVerdict{jump(chainServices)}})
	t.addChain(chainNatOutput, &hook{"nat", "output", prioDstNAT}, rule{tVerdict{jump(chainServices)}})
	t.addChain(chainNatPostrouting, &hook{"nat", "postrouting", prioSrcNAT},
		rule{tVerdict{jump(chainMasquerading)}},
		rule{tVerdict{jump(chainPodEgress)}},
	)
	t.addChain(chainFilterPrerouting, &hook{"filter", "prerouting", prioFilterPre}, rule{tCtStateNew{}, tVerdict{jump(chainEndpointsCheck)}})
	t.addChain(chainFilterOutput, &hook{"filter", "output", prioFilterPre}, rule{tCtStateNew{}, tVerdict{jump(chainEndpointsCheck)}})
	masq := t.addChain(chainMasquerading, nil)
	t.addChain(chainPodEgress, nil, podEgress(mc)...)
	t.addChain(chainReject, nil,
		rule{tL4proto{protoTCP}, sReject{tcpReset: true}},
		rule{sReject{}},
	)
	services := t.addChain(chainServices, nil)
	check := t.addChain(chainEndpointsCheck, nil)
	for _, f := range families {
		a := addrField(f)
		t.addSet(famName(mapServiceIPs, f), true, 0, a, kProto, kPort)
		t.addSet(famName(mapServiceNodePorts, f), true, 0, kProto, kPort)
		npIPs := t.addSet(famName(setNodePortIPs, f), false, 0, a)
		t.addSet(famName(mapNoEndpointServices, f), true, 0, a, kProto, kPort)
		t.addSet(famName(mapNoEndpointNodePorts, f), true, 0, kProto, kPort)
		t.addSet(famName(setClusterIPs, f), false, 0, a)
		t.addSet(famName(setHairpin, f), false, 0, a, a)
		for _, ip := range mc.nodeIPs {
			if familyOf(ip) == f {
				npIPs.elems[elemKey{addr: ip}] = verdict{}
			}
		}
		services.rules = append(services.rules,
			rule{tVmapService{f, famName(mapServiceIPs, f)}},
			rule{tDaddrInSet{f, famName(setNodePortIPs, f)}, tVmapNodePort{famName(mapServiceNodePorts, f)}},
		)
		check.rules = append(check.rules,
			rule{tVmapService{f, famName(mapNoEndpointServices, f)}},
			rule{tDaddrInSet{f, famName(setNodePortIPs, f)}, tVmapNodePort{famName(mapNoEndpointNodePorts, f)}},
			rule{tDaddrInSet{f, famName(setClusterIPs, f)}, tVerdict{goTo(chainReject)}},
		)
		// A pod that reaches a Service and is sent to itself must see
		// the reply come from the Service: masquerade it.
		masq.rules = append(masq.rules, rule{tPairInSet{f, famName(setHairpin, f)}, sMasquerade{}})
	}
	masq.rules = append(masq.rules,
		rule{tMarkClear{mark}, tVerdict{verdict{kind: vReturn}}},
		rule{sMarkXor{mark}},
		rule{sMasquerade{}},
	)
	return t
}

// setElem is one element of a shared set or map.
type setElem struct {
	set string
	key elemKey
	val verdict
}

// A fragment is what one Service puts in the table: its own chains and
// session-affinity sets, its elements of the shared sets and maps, and its
// endpoints' addresses for the shared hairpin sets.
type fragment struct {
	chains  []*chain
	sets    []*set
	elems   []setElem
	hairpin []netip.Addr
	// ports is what conntrack cleanup needs of its service ports.
	ports map[string]portState
}

// digest sums up the fragment: equal digests, equal fragments. A nil
// fragment's is "".
func (fr *fragment) digest() string {
	if fr == nil {
		return ""
	}
	var b strings.Builder
	for _, c := range fr.chains {
		b.WriteString(c.name + "\n")
	}
	for _, s := range fr.sets {
		fmt.Fprintf(&b, "%s %v %v\n", s.name, s.key, s.timeout)
	}
	for _, e := range fr.elems {
		fmt.Fprintf(&b, "%s %v %v\n", e.set, e.key, e.val)
	}
	return digest(b.String())
}

// buildFragment builds the fragment of one Service from its service ports.
func buildFragment(mc *modelConfig, ports []servicePort) *fragment {
	fr := &fragment{ports: portStates(ports)}
	for i := range ports {
		fr.addServicePort(mc, &ports[i])
	}
	return fr
}

// buildTable computes the whole desired table for the given service ports,
// as a full sync writes it.
func buildTable(mc modelConfig, ports []servicePort) *table {
	st := newState(mc)
	for len(ports) > 0 {
		n := 1
		for n < len(ports) && ports[n].name.Namespace == ports[0].name.Namespace && ports[n].name.Name == ports[0].name.Name {
			n++
		}
		st.put(ports[0].name.Namespace+"/"+ports[0].name.Name, buildFragment(&mc, ports[:n]))
		ports = ports[n:]
	}
	return st.table()
}

// addServicePort adds one service port's chains and elements. The
// structure follows kube-proxy's nftables mode:
//
//	service-ips: clusterIP -> internal chain (svc or local)
//	             externalIP -> ext chain
//	service-nodeports: nodePort -> ext chain
//	svc chain (Cluster policy): masquerade mark, then a random endpoint
//	local chain (Local policy): a random endpoint of this node's
//	ext chain: masquerade (Cluster) or short-circuits (Local), then svc/local
//
// A random endpoint is picked as iptables' statistic match did: of n
// endpoints, the first is taken once in n, else the second once in n-1,
// and so on, each a rule that DNATs. kube-proxy looks the pick up in an
// anonymous map per Service instead; but the kernel's cost of adding a
// set grows with the sets the table has, and of binding a map with the
// elements it has, so at thousands of Services a full sync's time grows
// with their square. Rules with no sets or jumps cost the same however
// many Services there are. Only a new connection's first packet walks
// them (NAT rules see nothing else), and no more of them than the Service
// has endpoints.
//
// With session affinity, each endpoint has a chain that records the
// client in the endpoint's affinity set and DNATs; the picks go to it.
func (fr *fragment) addServicePort(mc *modelConfig, sp *servicePort) {
	f := sp.family
	cluster, local, reachable, hasAny := sp.categorize()
	usesCluster := len(cluster) > 0 && sp.usesClusterEndpoints()
	usesLocal := len(local) > 0 && sp.usesLocalEndpoints()
	hasInternal, hasExternal := hasAny, hasAny
	if sp.internalLocal {
		hasInternal = len(local) > 0
	}
	if sp.externalLocal {
		hasExternal = len(local) > 0
	}
	// The ext chain exists whenever some endpoint exists, even with no local
	// one under policy Local: pods and the node itself still reach the
	// Service through it.
	usesExt := hasAny && sp.externallyAccessible()

	var internalFilter, externalFilter verdict
	switch {
	case !hasAny:
		internalFilter, externalFilter = goTo(chainReject), goTo(chainReject)
	default:
		if !hasInternal {
			internalFilter = verdict{kind: vDrop}
		}
		if !hasExternal {
			externalFilter = verdict{kind: vDrop}
		}
	}

	name := sp.name.String()
	spKey := elemKey{addr: sp.clusterIP, proto: sp.name.Protocol, port: sp.port}
	mark := sMarkOr{mc.mark}
	for _, e := range reachable {
		fr.hairpin = append(fr.hairpin, e.addr)
	}
	epChains := map[endpoint]string{}
	if sp.affinity > 0 {
		for _, e := range reachable {
			aff := sp.endpointName("aff", e)
			fr.sets = append(fr.sets, &set{name: aff, key: []keyField{addrField(f)}, timeout: sp.affinity, elems: map[elemKey]verdict{}})
			rules := []rule{
				{sUpdateSaddr{f, aff}},
				{sDNAT{f, e.addr, e.port}},
			}
			epChains[e] = fr.addChain("ep", f, name+"/"+e.String(), rules)
		}
	}
	// dispatch picks one of eps: first a client's affinity, if any, then a
	// random endpoint.
	dispatch := func(eps []endpoint) []rule {
		var rules []rule
		if sp.affinity > 0 {
			for _, e := range eps {
				rules = append(rules, rule{tSaddrInSet{f, sp.endpointName("aff", e)}, tVerdict{goTo(epChains[e])}})
			}
		}
		for i, e := range eps {
			var r rule
			if left := len(eps) - i; left > 1 {
				r = rule{tNumgenZero{uint32(left)}}
			}
			if sp.affinity > 0 {
				r = append(r, tVerdict{goTo(epChains[e])})
			} else {
				r = append(r, sDNAT{f, e.addr, e.port})
			}
			rules = append(rules, r)
		}
		return rules
	}

	var clusterChain, localChain, extChain string
	if usesCluster {
		// Traffic from outside the pod network is masqueraded. The svc
		// chain is reached for the ClusterIP, or from the ext chain, which
		// has marked what needs it, so the source is all there is to check;
		// but masquerade-all marks only what is for the ClusterIP, as
		// kube-proxy does.
		var rules []rule
		if mc.masqAll {
			rules = append(rules, rule{tDaddr{f, sp.clusterIP}, tL4proto{sp.name.Protocol}, tDport{sp.port}, mark})
		} else if cidrs := mc.cidrs(f); len(cidrs) > 0 {
			var match rule
			for _, p := range cidrs {
				match = append(match, tSaddr{f, p, true})
			}
			rules = append(rules, append(match, mark))
		}
		rules = append(rules, dispatch(cluster)...)
		clusterChain = fr.addChain("svc", f, name, rules)
	}
	if usesLocal {
		localChain = fr.addChain("local", f, name, dispatch(local))
	}
	internalChain, externalPolicyChain := clusterChain, clusterChain
	if sp.internalLocal {
		internalChain = localChain
	}
	if sp.externalLocal {
		externalPolicyChain = localChain
	}
	if usesExt {
		var rules []rule
		if sp.externalLocal {
			if usesCluster {
				// Pods reaching the external address are inside the
				// cluster: they get Cluster policy, without masquerade.
				for _, p := range mc.cidrs(f) {
					rules = append(rules, rule{tSaddr{f, p, false}, tVerdict{goTo(clusterChain)}})
				}
			}
			// The node itself reaching its own external address: its source
			// address would not route back, so masquerade.
			rules = append(rules, rule{tFibSaddrLocal{}, mark})
			if usesCluster {
				rules = append(rules, rule{tFibSaddrLocal{}, tVerdict{goTo(clusterChain)}})
			}
		} else {
			rules = append(rules, rule{mark})
		}
		if hasExternal {
			rules = append(rules, rule{tVerdict{goTo(externalPolicyChain)}})
		}
		extChain = fr.addChain("ext", f, name, rules)
	}

	add := func(set string, k elemKey, v verdict) {
		fr.elems = append(fr.elems, setElem{famName(set, f), k, v})
	}
	proto := sp.name.Protocol
	if sp.clusterIP.IsValid() {
		add(setClusterIPs, elemKey{addr: sp.clusterIP}, verdict{})
		if hasInternal {
			add(mapServiceIPs, spKey, goTo(internalChain))
		}
		if !internalFilter.isZero() {
			add(mapNoEndpointServices, spKey, internalFilter)
		}
	}
	for _, a := range sp.externalIPs {
		k := elemKey{addr: a, proto: proto, port: sp.port}
		if usesExt {
			add(mapServiceIPs, k, goTo(extChain))
		}
		if !externalFilter.isZero() {
			add(mapNoEndpointServices, k, externalFilter)
		}
	}
	if sp.nodePort != 0 {
		k := elemKey{proto: proto, port: sp.nodePort}
		if usesExt {
			add(mapServiceNodePorts, k, goTo(extChain))
		}
		if !externalFilter.isZero() {
			add(mapNoEndpointNodePorts, k, externalFilter)
		}
	}
}

// addChain adds a sealed chain and returns its name.
func (fr *fragment) addChain(kind string, f family, what string, rules []rule) string {
	name := sealedName(kind, f, what, rules)
	fr.chains = append(fr.chains, &chain{name: name, rules: rules, sealed: true})
	return name
}

// endpointName names an endpoint's affinity set:
// aff4-default/web/tcp/http/10.1.0.5:8080.
func (sp *servicePort) endpointName(kind string, e endpoint) string {
	return fmt.Sprintf("%s%d-%s/%s", kind, sp.family, sp.name, e)
}
