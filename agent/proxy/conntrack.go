package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// UDP has no connection to end: a conntrack entry that DNATs a client to an
// endpoint outlives the endpoint, and the client keeps sending into the void
// until the entry times out. So after a sync, for UDP service ports only:
//   - flows DNATed to an endpoint that is no longer reachable are deleted;
//   - when a service port goes from no endpoint to some, flows to its
//     frontends that were never DNATed (sent while it had none) are deleted.
// TCP and SCTP need nothing: their clients see a reset or time out and
// reconnect, and a new connection is a new entry.

// portState is what conntrack cleanup needs to know of one UDP service
// port.
type portState struct {
	family    family
	frontends []netip.AddrPort // clusterIP:port, externalIP:port
	nodePort  uint16
	endpoints []netip.AddrPort // reachable endpoints, sorted
}

// portStates are the UDP ports' of ports: the others need no cleanup, and
// a cluster of TCP Services keeps no state for it.
func portStates(ports []servicePort) map[string]portState {
	var m map[string]portState
	for i := range ports {
		sp := &ports[i]
		if sp.name.Protocol != protoUDP {
			continue
		}
		if m == nil {
			m = map[string]portState{}
		}
		st := portState{family: sp.family, nodePort: sp.nodePort}
		if sp.clusterIP.IsValid() {
			st.frontends = append(st.frontends, netip.AddrPortFrom(sp.clusterIP, sp.port))
		}
		for _, a := range sp.externalIPs {
			st.frontends = append(st.frontends, netip.AddrPortFrom(a, sp.port))
		}
		_, _, reachable, _ := sp.categorize()
		for _, e := range reachable {
			st.endpoints = append(st.endpoints, netip.AddrPortFrom(e.addr, e.port))
		}
		m[sp.key()] = st
	}
	return m
}

// flowFilter selects conntrack entries of one service port.
type flowFilter struct {
	family    family
	proto     protocol
	frontends []netip.AddrPort
	nodePort  uint16
	nodeIPs   []netip.Addr
	// endpoint, if valid, selects flows DNATed to it; if not, flows to the
	// frontends that were not DNATed at all.
	endpoint netip.AddrPort
}

func (f flowFilter) String() string {
	var fe []string
	for _, a := range f.frontends {
		fe = append(fe, a.String())
	}
	if f.nodePort != 0 {
		fe = append(fe, fmt.Sprintf("nodeport %d", f.nodePort))
	}
	to := "not DNATed"
	if f.endpoint.IsValid() {
		to = "to " + f.endpoint.String()
	}
	return fmt.Sprintf("%s %s %s", f.proto, strings.Join(fe, ","), to)
}

// flow is a conntrack entry as the filter sees it: the original direction's
// destination and the reply direction's source (which DNAT rewrote).
type flow struct {
	proto    protocol
	origDst  netip.AddrPort
	replySrc netip.AddrPort
}

func (f flowFilter) match(fl flow) bool {
	if fl.proto != f.proto {
		return false
	}
	toFrontend := slices.Contains(f.frontends, fl.origDst) ||
		(f.nodePort != 0 && fl.origDst.Port() == f.nodePort && slices.Contains(f.nodeIPs, fl.origDst.Addr()))
	if !toFrontend {
		return false
	}
	if f.endpoint.IsValid() {
		return fl.replySrc == f.endpoint
	}
	return fl.replySrc == fl.origDst
}

// staleFlows compares the service ports before and after a sync, as
// portStates has them: UDP ones only.
func staleFlows(old, cur map[string]portState, nodeIPs []netip.Addr) []flowFilter {
	var out []flowFilter
	for _, key := range sortedKeys(old) {
		o := old[key]
		c, ok := cur[key]
		for _, ep := range o.endpoints {
			if ok && slices.Contains(c.endpoints, ep) {
				continue
			}
			out = append(out, flowFilter{family: o.family, proto: protoUDP, frontends: o.frontends, nodePort: o.nodePort, nodeIPs: nodeIPs, endpoint: ep})
		}
	}
	for _, key := range sortedKeys(cur) {
		c := cur[key]
		if len(c.endpoints) == 0 {
			continue
		}
		if o, ok := old[key]; ok && len(o.endpoints) > 0 {
			continue
		}
		out = append(out, flowFilter{family: c.family, proto: protoUDP, frontends: c.frontends, nodePort: c.nodePort, nodeIPs: nodeIPs})
	}
	return out
}
