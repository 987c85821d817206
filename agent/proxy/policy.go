package proxy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// NetworkPolicy is enforced in a table of its own (PolicyEnforcer), built
// by the same model, plan and programmer as the Services'. Its shape:
//
//	egress  (filter forward, priority 0): replies pass; a packet from an
//	        egress-isolated pod of this node jumps to that pod's chain
//	ingress (filter forward, priority 1): the same for ingress, by the
//	        destination pod of this node
//	pod chain: its traffic to itself passes; a jump to the chain of each
//	        policy that selects the pod, then drop
//	policy chain: a rule per peer and port of each of the policy's rules,
//	        accepting what it allows
//
// An accept in the egress chain ends that chain only: the ingress chain,
// a base chain of its own on the same hook, still checks the destination.
// Pods that peers select are sets of addresses, one per rule and family;
// a named port is a set of address . protocol . port of the pods that
// name it. A change of pods or namespaces changes set elements; a
// change of policy rewrites its chains, which are sealed like a Service's.
// Traffic the node itself sends or receives does not pass the forward
// hook, and so is never filtered: kubelet probes reach isolated pods.

// Names of the policy table's fixed chains and maps.
const (
	chainPolicyEgress  = "egress"
	chainPolicyIngress = "ingress"
	mapEgressPods      = "egress-pods"  // address of an egress-isolated pod: goto its chain
	mapIngressPods     = "ingress-pods" // address of an ingress-isolated pod: goto its chain
)

// policyInput is what the policy table is built from.
type policyInput struct {
	nodeName   string
	policies   []*networkingv1.NetworkPolicy
	pods       []*v1.Pod
	namespaces map[string]labels.Set // by name
}

// policyProblem is a policy the table leaves out, and why.
type policyProblem struct {
	policy *networkingv1.NetworkPolicy
	why    string
}

// policyPod is a pod that policies can select: one with addresses that
// is not on the host's network and has not ended.
type policyPod struct {
	pod   *v1.Pod
	addrs []netip.Addr
}

// direction is ingress or egress, and what differs between them.
type direction struct {
	name   string // in or out
	remote func(f family, set string) term
	block  func(f family, p netip.Prefix, not bool) term
	vmap   string
}

var (
	ingress = direction{name: "in",
		remote: func(f family, s string) term { return tSaddrInSet{f, s} },
		block:  func(f family, p netip.Prefix, not bool) term { return tSaddr{f, p, not} },
		vmap:   mapIngressPods}
	egress = direction{name: "out",
		remote: func(f family, s string) term { return tDaddrInSet{f, s} },
		block:  func(f family, p netip.Prefix, not bool) term { return tDaddrNet{f, p, not} },
		vmap:   mapEgressPods}
)

// buildPolicyTable builds the policy table for the pods of in.nodeName.
func buildPolicyTable(in policyInput) (*table, []policyProblem) {
	t := newTable()
	established := rule{tCtStateEstablished{}, tVerdict{verdict{kind: vAccept}}}
	egressBase := t.addChain(chainPolicyEgress, &hook{"filter", "forward", 0}, established)
	ingressBase := t.addChain(chainPolicyIngress, &hook{"filter", "forward", 1}, established)
	for _, f := range families {
		t.addSet(famName(mapEgressPods, f), true, 0, addrField(f))
		t.addSet(famName(mapIngressPods, f), true, 0, addrField(f))
		egressBase.rules = append(egressBase.rules, rule{tVmapAddr{f, famName(mapEgressPods, f), true}})
		ingressBase.rules = append(ingressBase.rules, rule{tVmapAddr{f, famName(mapIngressPods, f), false}})
	}

	var pods []policyPod
	byNS := map[string][]policyPod{}
	for _, p := range in.pods {
		if pp, ok := selectable(p); ok {
			pods = append(pods, pp)
			byNS[p.Namespace] = append(byNS[p.Namespace], pp)
		}
	}
	policies := slices.Clone(in.policies)
	slices.SortFunc(policies, func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	// chainsOf lists, by direction and local pod address, the policy
	// chains that apply to it.
	chainsOf := map[string]map[netip.Addr][]string{ingress.name: {}, egress.name: {}}
	var problems []policyProblem
	for _, np := range policies {
		// The policy's chains and sets go to a table of their own first:
		// a policy that cannot be honoured whole is left out whole.
		b := policyBuilder{t: newTable(), np: np, pods: pods, byNS: byNS, namespaces: in.namespaces}
		applies, err := b.build(in.nodeName)
		if err != nil {
			problems = append(problems, policyProblem{np, err.Error()})
			continue
		}
		maps.Copy(t.chains, b.t.chains)
		maps.Copy(t.sets, b.t.sets)
		for dir, byAddr := range applies {
			for a, c := range byAddr {
				chainsOf[dir][a] = append(chainsOf[dir][a], c)
			}
		}
	}
	for _, d := range []direction{ingress, egress} {
		for a, chains := range chainsOf[d.name] {
			f := familyOf(a)
			// A pod cannot block access to itself, as through its own
			// Service.
			rules := []rule{{d.block(f, netip.PrefixFrom(a, a.BitLen()), false), tVerdict{verdict{kind: vAccept}}}}
			for _, c := range chains {
				rules = append(rules, rule{tVerdict{jump(c)}})
			}
			rules = append(rules, rule{tVerdict{verdict{kind: vDrop}}})
			name := sealedName("pod-"+d.name, f, a.String(), rules)
			t.chains[name] = &chain{name: name, rules: rules, sealed: true}
			t.sets[famName(d.vmap, f)].elems[elemKey{addr: a}] = goTo(name)
		}
	}
	return t, problems
}

// selectable returns p as policies see it, if it is a pod they can select.
func selectable(p *v1.Pod) (policyPod, bool) {
	if p.Spec.HostNetwork || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		return policyPod{}, false
	}
	pp := policyPod{pod: p}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			pp.addrs = append(pp.addrs, a.Unmap())
		}
	}
	return pp, len(pp.addrs) > 0
}

// policyBuilder builds one policy's part of the table.
type policyBuilder struct {
	t          *table
	np         *networkingv1.NetworkPolicy
	pods       []policyPod
	byNS       map[string][]policyPod // pods by namespace
	namespaces map[string]labels.Set
}

func (b *policyBuilder) name() string { return b.np.Namespace + "/" + b.np.Name }

// build adds the policy's chains and sets to b.t, and returns, by
// direction and address of the node's pods it selects, its chain.
func (b *policyBuilder) build(node string) (map[string]map[netip.Addr]string, error) {
	selected, err := b.selected(node)
	if err != nil {
		return nil, err
	}
	applies := map[string]map[netip.Addr]string{}
	for _, d := range b.directions() {
		chains, err := b.chains(d, selected)
		if err != nil {
			return nil, err
		}
		applies[d.name] = map[netip.Addr]string{}
		for _, p := range selected {
			for _, a := range p.addrs {
				applies[d.name][a] = chains[familyOf(a)]
			}
		}
	}
	return applies, nil
}

// selected returns the pods of the node that the policy selects.
func (b *policyBuilder) selected(node string) ([]policyPod, error) {
	sel, err := metav1.LabelSelectorAsSelector(&b.np.Spec.PodSelector)
	if err != nil {
		return nil, fmt.Errorf("spec.podSelector: %w", err)
	}
	var out []policyPod
	for _, p := range b.byNS[b.np.Namespace] {
		if p.pod.Spec.NodeName == node && sel.Matches(labels.Set(p.pod.Labels)) {
			out = append(out, p)
		}
	}
	return out, nil
}

// directions are those the policy isolates, by its policyTypes or, without
// them, as the API defaults them: ingress always, egress if it has rules.
func (b *policyBuilder) directions() []direction {
	types := b.np.Spec.PolicyTypes
	if len(types) == 0 {
		types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(b.np.Spec.Egress) > 0 {
			types = append(types, networkingv1.PolicyTypeEgress)
		}
	}
	var ds []direction
	if slices.Contains(types, networkingv1.PolicyTypeIngress) {
		ds = append(ds, ingress)
	}
	if slices.Contains(types, networkingv1.PolicyTypeEgress) {
		ds = append(ds, egress)
	}
	return ds
}

// A policyRule is one ingress or egress rule, whichever the direction.
type policyRule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
	path  string // spec.ingress[i] or spec.egress[i], for errors
}

func (b *policyBuilder) rules(d direction) []policyRule {
	var out []policyRule
	if d.name == ingress.name {
		for i, r := range b.np.Spec.Ingress {
			out = append(out, policyRule{r.From, r.Ports, fmt.Sprintf("spec.ingress[%d]", i)})
		}
	} else {
		for i, r := range b.np.Spec.Egress {
			out = append(out, policyRule{r.To, r.Ports, fmt.Sprintf("spec.egress[%d]", i)})
		}
	}
	return out
}

// chains adds the policy's chains of direction d, one per family, and
// their sets; the destination pods of ingress named ports are the
// selected ones.
func (b *policyBuilder) chains(d direction, selected []policyPod) (map[family]string, error) {
	out := map[family]string{}
	for _, f := range families {
		var rules []rule
		for i, r := range b.rules(d) {
			what := fmt.Sprintf("%s/%s/%d", b.name(), d.name, i)
			peers, err := b.peerTerms(d, f, what, r)
			if err != nil {
				return nil, err
			}
			dests := b.pods // egress: any pod may be the destination
			if d.name == ingress.name {
				dests = selected
			}
			ports, err := b.portTerms(f, what, r, dests)
			if err != nil {
				return nil, err
			}
			for _, pm := range peers {
				for _, qm := range ports {
					rules = append(rules, append(slices.Concat(pm, qm), tVerdict{verdict{kind: vAccept}}))
				}
			}
		}
		name := sealedName("policy-"+d.name, f, b.name(), rules)
		b.t.chains[name] = &chain{name: name, rules: rules, sealed: true}
		out[f] = name
	}
	return out, nil
}

// peerTerms returns the alternatives of matches for the rule's peers of
// family f: none at all for no peers (everyone), a set of the selected
// pods' addresses for the selector peers, and a match per ipBlock.
func (b *policyBuilder) peerTerms(d direction, f family, what string, r policyRule) ([][]term, error) {
	if len(r.peers) == 0 {
		return [][]term{nil}, nil
	}
	var out [][]term
	var set *set
	for j, peer := range r.peers {
		path := fmt.Sprintf("%s.%s[%d]", r.path, map[string]string{"in": "from", "out": "to"}[d.name], j)
		if blk := peer.IPBlock; blk != nil {
			cidr, err := netip.ParsePrefix(blk.CIDR)
			if err != nil {
				return nil, fmt.Errorf("%s.ipBlock.cidr: %q is not a CIDR", path, blk.CIDR)
			}
			if familyOf(cidr.Addr()) != f {
				continue
			}
			var m []term
			for k, e := range blk.Except {
				ex, err := netip.ParsePrefix(e)
				if err != nil {
					return nil, fmt.Errorf("%s.ipBlock.except[%d]: %q is not a CIDR", path, k, e)
				}
				m = append(m, d.block(f, ex.Masked(), true))
			}
			out = append(out, append(m, d.block(f, cidr.Masked(), false)))
			continue
		}
		pods, err := b.peerPods(peer, path)
		if err != nil {
			return nil, err
		}
		if set == nil {
			set = b.t.addSet(famName(what+"/peers", f), false, 0, addrField(f))
			out = append(out, []term{d.remote(f, set.name)})
		}
		for _, p := range pods {
			for _, a := range p.addrs {
				if familyOf(a) == f {
					set.elems[elemKey{addr: a}] = verdict{}
				}
			}
		}
	}
	if out == nil {
		return nil, nil // peers of the other family only: nothing of f passes
	}
	return out, nil
}

// peerPods returns the pods a selector peer selects: by podSelector in the
// policy's namespace, by namespaceSelector in the namespaces it selects,
// or by both.
func (b *policyBuilder) peerPods(peer networkingv1.NetworkPolicyPeer, path string) ([]policyPod, error) {
	podSel, nsSel := labels.Everything(), labels.Nothing()
	var err error
	if peer.PodSelector != nil {
		if podSel, err = metav1.LabelSelectorAsSelector(peer.PodSelector); err != nil {
			return nil, fmt.Errorf("%s.podSelector: %w", path, err)
		}
	}
	if peer.NamespaceSelector != nil {
		if nsSel, err = metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil {
			return nil, fmt.Errorf("%s.namespaceSelector: %w", path, err)
		}
	}
	nss := []string{b.np.Namespace}
	if peer.NamespaceSelector != nil {
		nss = nil
		for ns, l := range b.namespaces {
			if nsSel.Matches(l) {
				nss = append(nss, ns)
			}
		}
	}
	var out []policyPod
	for _, ns := range nss {
		for _, p := range b.byNS[ns] {
			if podSel.Matches(labels.Set(p.pod.Labels)) {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// portTerms returns the alternatives of matches for the rule's ports of
// family f: none at all for no ports (every port), a protocol, a port or
// a range of them, or for a named port a set of the addresses, protocol
// and number under which dests, the destination pods, name it.
func (b *policyBuilder) portTerms(f family, what string, r policyRule, dests []policyPod) ([][]term, error) {
	if len(r.ports) == 0 {
		return [][]term{nil}, nil
	}
	var out [][]term
	for j, p := range r.ports {
		path := fmt.Sprintf("%s.ports[%d]", r.path, j)
		proto := v1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		pr, ok := protocolOf(proto)
		if !ok {
			return nil, fmt.Errorf("%s.protocol: %q is not TCP, UDP or SCTP", path, proto)
		}
		switch {
		case p.Port == nil:
			out = append(out, []term{tL4proto{pr}})
		case p.Port.StrVal != "":
			set := b.t.addSet(famName(fmt.Sprintf("%s/port/%d", what, j), f), false, 0, addrField(f), kProto, kPort)
			for _, d := range dests {
				if port := namedPort(d.pod, p.Port.StrVal, proto); port != 0 {
					for _, a := range d.addrs {
						if familyOf(a) == f {
							set.elems[elemKey{addr: a, proto: pr, port: port}] = verdict{}
						}
					}
				}
			}
			out = append(out, []term{tDaddrProtoPortInSet{f, set.name}})
		case p.EndPort != nil:
			if *p.EndPort < p.Port.IntVal {
				return nil, fmt.Errorf("%s.endPort: %d is below port %d", path, *p.EndPort, p.Port.IntVal)
			}
			out = append(out, []term{tL4proto{pr}, tDportRange{uint16(p.Port.IntVal), uint16(*p.EndPort)}})
		default:
			out = append(out, []term{tL4proto{pr}, tDport{uint16(p.Port.IntVal)}})
		}
	}
	return out, nil
}

// namedPort returns the number of the container port of pod named name
// with protocol proto, or 0.
func namedPort(pod *v1.Pod, name string, proto v1.Protocol) uint16 {
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			p := cp.Protocol
			if p == "" {
				p = v1.ProtocolTCP
			}
			if cp.Name == name && p == proto {
				return uint16(cp.ContainerPort)
			}
		}
	}
	return 0
}
