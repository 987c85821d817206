package api

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Network reads the links, addresses and routes of the agent's network
// namespace (the host's on a node) over netlink, and its nftables ruleset.
func (s *machineServer) Network(context.Context, *machine.NetworkRequest) (*machine.NetworkResponse, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list links: %v", err)
	}
	resp := &machine.NetworkResponse{}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		link := &machine.Link{Name: a.Name, Index: int32(a.Index), State: a.OperState.String(), Mtu: int32(a.MTU), Mac: a.HardwareAddr.String(), Type: l.Type()}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list addresses of %s: %v", a.Name, err)
		}
		for _, ad := range addrs {
			link.Addresses = append(link.Addresses, ad.IPNet.String())
		}
		resp.Links = append(resp.Links, link)
	}
	// Every table, not only main: local and policy routing tables too.
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list routes: %v", err)
	}
	for _, r := range routes {
		route := &machine.Route{Destination: "default", Device: names[r.LinkIndex], Table: uint32(r.Table), Metric: int32(r.Priority), Type: routeType(r.Type)}
		if r.Dst != nil {
			route.Destination = r.Dst.String()
		}
		if r.Gw != nil {
			route.Gateway = r.Gw.String()
		}
		if r.Src != nil {
			route.Source = r.Src.String()
		}
		resp.Routes = append(resp.Routes, route)
	}
	resp.Nftables, err = nftRuleset()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "nftables: %v", err)
	}
	return resp, nil
}

// routeType names an RTN_* route type as ip-route(8) does.
func routeType(t int) string {
	switch t {
	case unix.RTN_UNICAST:
		return "unicast"
	case unix.RTN_LOCAL:
		return "local"
	case unix.RTN_BROADCAST:
		return "broadcast"
	case unix.RTN_ANYCAST:
		return "anycast"
	case unix.RTN_MULTICAST:
		return "multicast"
	case unix.RTN_BLACKHOLE:
		return "blackhole"
	case unix.RTN_UNREACHABLE:
		return "unreachable"
	case unix.RTN_PROHIBIT:
		return "prohibit"
	}
	return strconv.Itoa(t)
}

// nftRuleset renders every table, set, chain and rule in the layout of
// `nft list ruleset`. Rules are rendered from their expressions: those
// Cairn programs (meta, payload, cmp, lookup, ct, nat, verdicts…) in nft's
// words, others by their expression's name.
func nftRuleset() (string, error) {
	conn, err := nftables.New()
	if err != nil {
		return "", err
	}
	defer conn.CloseLasting()
	tables, err := conn.ListTables()
	if err != nil {
		return "", fmt.Errorf("list tables: %w", err)
	}
	chains, err := conn.ListChains()
	if err != nil {
		return "", fmt.Errorf("list chains: %w", err)
	}
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "table %s %s {\n", tableFamily(t.Family), t.Name)
		sets, err := conn.GetSets(t)
		if err != nil {
			return "", fmt.Errorf("sets of table %s: %w", t.Name, err)
		}
		for _, s := range sets {
			if s.Anonymous {
				continue
			}
			kind, typ := "set", s.KeyType.Name
			if s.IsMap {
				kind, typ = "map", typ+" : "+s.DataType.Name
			}
			fmt.Fprintf(&b, "\t%s %s {\n\t\ttype %s\n\t}\n", kind, s.Name, typ)
		}
		for _, c := range chains {
			if c.Table.Name != t.Name || c.Table.Family != t.Family {
				continue
			}
			fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
			if c.Hooknum != nil {
				policy := "accept"
				if c.Policy != nil && *c.Policy == nftables.ChainPolicyDrop {
					policy = "drop"
				}
				prio := 0
				if c.Priority != nil {
					prio = int(*c.Priority)
				}
				fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d; policy %s;\n", c.Type, chainHook(t.Family, *c.Hooknum), prio, policy)
			}
			rules, err := conn.GetRules(t, c)
			if err != nil {
				return "", fmt.Errorf("rules of chain %s %s: %w", t.Name, c.Name, err)
			}
			for _, r := range rules {
				fmt.Fprintf(&b, "\t\t%s\n", renderRule(r.Exprs))
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String(), nil
}

func tableFamily(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	case nftables.TableFamilyBridge:
		return "bridge"
	}
	return strconv.Itoa(int(f))
}

func chainHook(f nftables.TableFamily, h nftables.ChainHook) string {
	if f == nftables.TableFamilyNetdev {
		return map[nftables.ChainHook]string{unix.NF_NETDEV_INGRESS: "ingress", unix.NF_NETDEV_EGRESS: "egress"}[h]
	}
	if name, ok := map[nftables.ChainHook]string{
		unix.NF_INET_PRE_ROUTING: "prerouting", unix.NF_INET_LOCAL_IN: "input", unix.NF_INET_FORWARD: "forward",
		unix.NF_INET_LOCAL_OUT: "output", unix.NF_INET_POST_ROUTING: "postrouting",
	}[h]; ok {
		return name
	}
	return strconv.Itoa(int(h))
}

var metaKeys = map[expr.MetaKey]string{
	expr.MetaKeyL4PROTO: "meta l4proto", expr.MetaKeyNFPROTO: "meta nfproto", expr.MetaKeyPROTOCOL: "meta protocol",
	expr.MetaKeyIIFNAME: "iifname", expr.MetaKeyOIFNAME: "oifname", expr.MetaKeyIIF: "iif", expr.MetaKeyOIF: "oif",
	expr.MetaKeyMARK: "meta mark", expr.MetaKeyPKTTYPE: "meta pkttype", expr.MetaKeySKUID: "meta skuid",
}

var ctKeys = map[expr.CtKey]string{
	expr.CtKeySTATE: "ct state", expr.CtKeyDIRECTION: "ct direction", expr.CtKeySTATUS: "ct status", expr.CtKeyMARK: "ct mark",
}

var cmpOps = map[expr.CmpOp]string{
	expr.CmpOpEq: "", expr.CmpOpNeq: "!= ", expr.CmpOpLt: "< ", expr.CmpOpLte: "<= ", expr.CmpOpGt: "> ", expr.CmpOpGte: ">= ",
}

// renderRule follows what each register holds, as nft does to print a
// load and a comparison as one match ("ip daddr 10.96.0.1").
func renderRule(exprs []expr.Any) string {
	regs := map[uint32]string{}
	var out []string
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			if e.SourceRegister {
				out = append(out, metaKeys[e.Key]+" set "+regs[e.Register])
				continue
			}
			regs[e.Register] = metaKeys[e.Key]
			if regs[e.Register] == "" {
				regs[e.Register] = "meta " + strconv.Itoa(int(e.Key))
			}
		case *expr.Ct:
			regs[e.Register] = ctKeys[e.Key]
			if regs[e.Register] == "" {
				regs[e.Register] = "ct " + strconv.Itoa(int(e.Key))
			}
		case *expr.Payload:
			regs[e.DestRegister] = payloadField(e)
		case *expr.Bitwise:
			regs[e.DestRegister] = regs[e.SourceRegister] + " & 0x" + fmt.Sprintf("%x", e.Mask)
		case *expr.Cmp:
			out = append(out, regs[e.Register]+" "+cmpOps[e.Op]+nftValue(regs[e.Register], e.Data))
		case *expr.Lookup:
			switch {
			case e.IsDestRegSet && e.DestRegister == 0: // the verdict register
				out = append(out, regs[e.SourceRegister]+" vmap @"+e.SetName)
			case e.IsDestRegSet:
				regs[e.DestRegister] = regs[e.SourceRegister] + " map @" + e.SetName
			case e.Invert:
				out = append(out, regs[e.SourceRegister]+" != @"+e.SetName)
			default:
				out = append(out, regs[e.SourceRegister]+" @"+e.SetName)
			}
		case *expr.Immediate:
			regs[e.Register] = "0x" + fmt.Sprintf("%x", e.Data)
		case *expr.Numgen:
			regs[e.Register] = "numgen random mod " + strconv.Itoa(int(e.Modulus))
		case *expr.Counter:
			out = append(out, fmt.Sprintf("counter packets %d bytes %d", e.Packets, e.Bytes))
		case *expr.Masq:
			out = append(out, "masquerade")
		case *expr.NAT:
			kind := "snat"
			if e.Type == expr.NATTypeDestNAT {
				kind = "dnat"
			}
			to := regs[e.RegAddrMin]
			if e.RegProtoMin != 0 {
				to += ":" + regs[e.RegProtoMin]
			}
			out = append(out, kind+" to "+to)
		case *expr.Reject:
			out = append(out, "reject")
		case *expr.Verdict:
			out = append(out, verdict(e))
		default:
			out = append(out, strings.ToLower(strings.TrimPrefix(fmt.Sprintf("%T", e), "*expr.")))
		}
	}
	return strings.Join(out, " ")
}

// payloadField names the header fields Cairn matches on; others in nft's
// raw form, @base,offset,length in bits.
func payloadField(p *expr.Payload) string {
	switch {
	case p.Base == expr.PayloadBaseNetworkHeader && p.Len == 4 && p.Offset == 12:
		return "ip saddr"
	case p.Base == expr.PayloadBaseNetworkHeader && p.Len == 4 && p.Offset == 16:
		return "ip daddr"
	case p.Base == expr.PayloadBaseNetworkHeader && p.Len == 16 && p.Offset == 8:
		return "ip6 saddr"
	case p.Base == expr.PayloadBaseNetworkHeader && p.Len == 16 && p.Offset == 24:
		return "ip6 daddr"
	case p.Base == expr.PayloadBaseTransportHeader && p.Len == 2 && p.Offset == 0:
		return "th sport"
	case p.Base == expr.PayloadBaseTransportHeader && p.Len == 2 && p.Offset == 2:
		return "th dport"
	}
	base := map[expr.PayloadBase]string{expr.PayloadBaseLLHeader: "ll", expr.PayloadBaseNetworkHeader: "nh", expr.PayloadBaseTransportHeader: "th"}[p.Base]
	return fmt.Sprintf("@%s,%d,%d", base, p.Offset*8, p.Len*8)
}

// nftValue writes data as the field it is compared with holds it.
func nftValue(field string, data []byte) string {
	switch {
	case strings.HasSuffix(field, "addr"):
		if a, ok := netip.AddrFromSlice(data); ok {
			return a.String()
		}
	case strings.HasSuffix(field, "port") && len(data) == 2:
		return strconv.Itoa(int(binary.BigEndian.Uint16(data)))
	case field == "meta l4proto" && len(data) == 1:
		if name, ok := map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp", unix.IPPROTO_ICMP: "icmp", unix.IPPROTO_ICMPV6: "ipv6-icmp"}[data[0]]; ok {
			return name
		}
	case field == "meta nfproto" && len(data) == 1:
		if name, ok := map[byte]string{unix.NFPROTO_IPV4: "ipv4", unix.NFPROTO_IPV6: "ipv6"}[data[0]]; ok {
			return name
		}
	case field == "iifname" || field == "oifname":
		return strconv.Quote(strings.TrimRight(string(data), "\x00"))
	}
	return fmt.Sprintf("0x%x", data)
}

func verdict(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictGoto:
		return "goto " + v.Chain
	case expr.VerdictContinue:
		return "continue"
	}
	return "verdict " + strconv.Itoa(int(v.Kind))
}
