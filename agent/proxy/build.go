package proxy

import (
	"fmt"
	"net/netip"
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
	chainMarkForMasq      = "mark-for-masquerade"
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
			rules = append(rules, rule{tDaddrNet{f, p}, tVerdict{verdict{kind: vReturn}}})
		}
	}
	for _, f := range families {
		for _, p := range mc.cidrs(f) {
			rules = append(rules, rule{tSaddr{f, p, false}, sMasquerade{}})
		}
	}
	return rules
}

// Per-Service names: kind, family, then the service port name, e.g.
// svc4-default/web/tcp/http; endpoint chains and affinity sets add the
// endpoint: ep4-default/web/tcp/http/10.1.0.5:8080.
func (sp *servicePort) chainName(kind string) string {
	return fmt.Sprintf("%s%d-%s", kind, sp.family, sp.name)
}

func (sp *servicePort) endpointName(kind string, e endpoint) string {
	return fmt.Sprintf("%s%d-%s/%s", kind, sp.family, sp.name, e)
}

// buildTable computes the desired table for the given service ports.
func buildTable(mc modelConfig, ports []servicePort) *table {
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
	t.addChain(chainMasquerading, nil,
		rule{tMarkClear{mark}, tVerdict{verdict{kind: vReturn}}},
		rule{sMarkXor{mark}},
		rule{sMasquerade{}},
	)
	t.addChain(chainMarkForMasq, nil, rule{sMarkOr{mark}})
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
	}
	for i := range ports {
		addServicePort(t, &mc, &ports[i])
	}
	return t
}

// addServicePort adds one service port's chains and map elements. The
// structure follows kube-proxy's nftables mode:
//
//	service-ips: clusterIP -> internal chain (svc or local)
//	             externalIP -> ext chain
//	service-nodeports: nodePort -> ext chain
//	svc chain (Cluster policy): masquerade check, affinity, numgen over endpoints
//	local chain (Local policy): affinity, numgen over this node's endpoints
//	ext chain: masquerade (Cluster) or short-circuits (Local), then svc/local
//	ep chain: hairpin masquerade, affinity update, DNAT
func addServicePort(t *table, mc *modelConfig, sp *servicePort) {
	f := sp.family
	cluster, local, reachable, hasAny := sp.categorize()
	clusterChain, localChain, extChain := sp.chainName("svc"), sp.chainName("local"), sp.chainName("ext")
	usesCluster := len(cluster) > 0 && sp.usesClusterEndpoints()
	usesLocal := len(local) > 0 && sp.usesLocalEndpoints()

	internalChain, hasInternal := clusterChain, hasAny
	if sp.internalLocal {
		internalChain, hasInternal = localChain, len(local) > 0
	}
	externalPolicyChain, hasExternal := clusterChain, hasAny
	if sp.externalLocal {
		externalPolicyChain, hasExternal = localChain, len(local) > 0
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

	for _, e := range reachable {
		var rules []rule
		rules = append(rules, rule{tSaddr{f, netip.PrefixFrom(e.addr, e.addr.BitLen()), false}, tVerdict{jump(chainMarkForMasq)}})
		if sp.affinity > 0 {
			aff := sp.endpointName("aff", e)
			t.addSet(aff, false, sp.affinity, addrField(f))
			rules = append(rules, rule{sUpdateSaddr{f, aff}})
		}
		rules = append(rules, rule{tL4proto{sp.name.Protocol}, sDNAT{f, e.addr, e.port}})
		t.addChain(sp.endpointName("ep", e), nil, rules...)
	}

	if usesCluster {
		var rules []rule
		if sp.clusterIP.IsValid() {
			match := rule{tDaddr{f, sp.clusterIP}, tL4proto{sp.name.Protocol}, tDport{sp.port}}
			if mc.masqAll {
				rules = append(rules, append(match, tVerdict{jump(chainMarkForMasq)}))
			} else if cidrs := mc.cidrs(f); len(cidrs) > 0 {
				for _, p := range cidrs {
					match = append(match, tSaddr{f, p, true})
				}
				rules = append(rules, append(match, tVerdict{jump(chainMarkForMasq)}))
			}
		}
		rules = append(rules, dispatch(sp, cluster)...)
		t.addChain(clusterChain, nil, rules...)
	}
	if usesLocal {
		t.addChain(localChain, nil, dispatch(sp, local)...)
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
			rules = append(rules, rule{tFibSaddrLocal{}, tVerdict{jump(chainMarkForMasq)}})
			if usesCluster {
				rules = append(rules, rule{tFibSaddrLocal{}, tVerdict{goTo(clusterChain)}})
			}
		} else {
			rules = append(rules, rule{tVerdict{jump(chainMarkForMasq)}})
		}
		if hasExternal {
			rules = append(rules, rule{tVerdict{goTo(externalPolicyChain)}})
		}
		t.addChain(extChain, nil, rules...)
	}

	proto := sp.name.Protocol
	svcIPs := t.sets[famName(mapServiceIPs, f)]
	noEP := t.sets[famName(mapNoEndpointServices, f)]
	if sp.clusterIP.IsValid() {
		k := elemKey{addr: sp.clusterIP, proto: proto, port: sp.port}
		t.sets[famName(setClusterIPs, f)].elems[elemKey{addr: sp.clusterIP}] = verdict{}
		if hasInternal {
			svcIPs.elems[k] = goTo(internalChain)
		}
		if !internalFilter.isZero() {
			noEP.elems[k] = internalFilter
		}
	}
	for _, a := range sp.externalIPs {
		k := elemKey{addr: a, proto: proto, port: sp.port}
		if usesExt {
			svcIPs.elems[k] = goTo(extChain)
		}
		if !externalFilter.isZero() {
			noEP.elems[k] = externalFilter
		}
	}
	if sp.nodePort != 0 {
		k := elemKey{proto: proto, port: sp.nodePort}
		if usesExt {
			t.sets[famName(mapServiceNodePorts, f)].elems[k] = goTo(extChain)
		}
		if !externalFilter.isZero() {
			t.sets[famName(mapNoEndpointNodePorts, f)].elems[k] = externalFilter
		}
	}
}

// dispatch picks one of eps: first a client's affinity, if any, then a
// random endpoint.
func dispatch(sp *servicePort, eps []endpoint) []rule {
	var rules []rule
	if sp.affinity > 0 {
		for _, e := range eps {
			rules = append(rules, rule{tSaddrInSet{sp.family, sp.endpointName("aff", e)}, tVerdict{goTo(sp.endpointName("ep", e))}})
		}
	}
	if len(eps) == 1 {
		return append(rules, rule{tVerdict{goTo(sp.endpointName("ep", eps[0]))}})
	}
	chains := make([]string, len(eps))
	for i, e := range eps {
		chains[i] = sp.endpointName("ep", e)
	}
	return append(rules, rule{tVmapNumgen{chains}})
}
