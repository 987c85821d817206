package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Network reads the links, addresses and routes of the agent's network
// namespace (the host's on a node) over netlink, and its nftables ruleset.
func (s *machineServer) Network(context.Context, *machine.NetworkRequest) (*machine.NetworkResponse, error) {
	links, err := vnl.LinkList()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list links: %v", err)
	}
	resp := &machine.NetworkResponse{}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		link := &machine.Link{Name: a.Name, Index: int32(a.Index), State: a.OperState.String(), Mtu: int32(a.MTU), Mac: a.HardwareAddr.String(), Type: l.Type()}
		addrs, err := vnl.AddrList(l, vnl.FAMILY_ALL)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list addresses of %s: %v", a.Name, err)
		}
		for _, ad := range addrs {
			link.Addresses = append(link.Addresses, ad.IPNet.String())
		}
		resp.Links = append(resp.Links, link)
	}
	// Every table, not only main: local and policy routing tables too.
	routes, err := vnl.RouteListFiltered(vnl.FAMILY_ALL, &vnl.Route{Table: unix.RT_TABLE_UNSPEC}, vnl.RT_FILTER_TABLE)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list routes: %v", err)
	}
	for _, r := range routes {
		route := &machine.Route{Destination: "default", Device: names[r.LinkIndex], Table: uint32(r.Table), Metric: int32(r.Priority), Type: routeType(r.Type)}
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones > 0 { // netlink writes a default route as 0.0.0.0/0
				route.Destination = r.Dst.String()
			}
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
	conn, err := nftables.New(nftables.AsLasting()) // one socket for every listing
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
		elems := map[string][]nftables.SetElement{}
		for _, s := range sets {
			if elems[s.Name], err = conn.GetSetElements(s); err != nil {
				return "", fmt.Errorf("elements of set %s %s: %w", t.Name, s.Name, err)
			}
		}
		// Rules before sets: the fields they look sets up by tell the sets'
		// types.
		var body strings.Builder
		rs := &ruleset{keys: map[string][]string{}, elems: elems}
		for _, c := range chains {
			if c.Table.Name != t.Name || c.Table.Family != t.Family {
				continue
			}
			fmt.Fprintf(&body, "\tchain %s {\n", c.Name)
			if c.Hooknum != nil {
				policy := "accept"
				if c.Policy != nil && *c.Policy == nftables.ChainPolicyDrop {
					policy = "drop"
				}
				prio := 0
				if c.Priority != nil {
					prio = int(*c.Priority)
				}
				fmt.Fprintf(&body, "\t\ttype %s hook %s priority %d; policy %s;\n", c.Type, chainHook(t.Family, *c.Hooknum), prio, policy)
			}
			rules, err := conn.GetRules(t, c)
			if err != nil {
				return "", fmt.Errorf("rules of chain %s %s: %w", t.Name, c.Name, err)
			}
			for _, r := range rules {
				fmt.Fprintf(&body, "\t\t%s\n", rs.render(r.Exprs))
			}
			body.WriteString("\t}\n")
		}
		for _, s := range sets {
			if !s.Anonymous { // those are written inline, in their rules
				renderSet(&b, s, rs.keys[s.Name], elems[s.Name])
			}
		}
		b.WriteString(body.String())
		b.WriteString("}\n")
	}
	return b.String(), nil
}

// renderSet writes a set or map with its elements, one a line. Its key's
// type is the kernel's, else (nftables v0.3.0 drops a map's key type when
// it reads the data type) that of the fields rules look it up by.
func renderSet(b *strings.Builder, s *nftables.Set, lookedUpBy []string, elems []nftables.SetElement) {
	kind := "set"
	if s.IsMap {
		kind = "map"
	}
	fmt.Fprintf(b, "\t%s %s {\n", kind, s.Name)
	var fields []string // how each part of a key is written
	switch {
	case s.KeyType.Name != "" && !(s.IsMap && s.KeyType.Name == nftables.TypeVerdict.Name):
		for _, t := range nftables.ConcatSetTypeElements(s.KeyType) {
			fields = append(fields, typeFields[t.Name])
		}
		fmt.Fprintf(b, "\t\ttype %s", s.KeyType.Name)
	case len(lookedUpBy) > 0:
		fields = lookedUpBy
		fmt.Fprintf(b, "\t\ttypeof %s", strings.Join(lookedUpBy, " . "))
	default:
		b.WriteString("\t\ttype unknown")
	}
	if s.IsMap {
		b.WriteString(" : verdict")
	}
	b.WriteString("\n")
	lines := elementLines(fields, elems)
	if len(lines) > 0 {
		fmt.Fprintf(b, "\t\telements = { %s }\n", strings.Join(lines, ",\n\t\t\t     "))
	}
	b.WriteString("\t}\n")
}

// elementLines writes each element of a set, its verdict after a map's
// key, ordered by key: the kernel's order changes from one listing to the
// next.
func elementLines(fields []string, elems []nftables.SetElement) []string {
	elems = slices.Clone(elems)
	slices.SortFunc(elems, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
	var lines []string
	for _, e := range elems {
		if e.IntervalEnd {
			continue
		}
		line := setKey(fields, e.Key)
		if v, ok := elementVerdict(e); ok {
			line += " : " + verdict(v)
		}
		lines = append(lines, line)
	}
	return lines
}

// elementVerdict decodes a map element's verdict. nftables v0.3.0 leaves
// it in Val as the netlink attributes it came in (NFTA_VERDICT_CODE and
// NFTA_VERDICT_CHAIN).
func elementVerdict(e nftables.SetElement) (*expr.Verdict, bool) {
	if e.VerdictData != nil {
		return e.VerdictData, true
	}
	ad, err := netlink.NewAttributeDecoder(e.Val)
	if err != nil || len(e.Val) == 0 {
		return nil, false
	}
	ad.ByteOrder = binary.BigEndian
	var v expr.Verdict
	var ok bool
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			v.Kind, ok = expr.VerdictKind(int32(ad.Uint32())), true
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = ad.String()
		}
	}
	return &v, ok && ad.Err() == nil
}

// typeFields are the fields that write a set type's values.
var typeFields = map[string]string{"ipv4_addr": "ip daddr", "ipv6_addr": "ip6 daddr", "inet_proto": "meta l4proto", "inet_service": "th dport", "ifname": "iifname"}

// fieldSizes are the sizes of the fields setKey can split a key into.
var fieldSizes = map[string]int{"ip daddr": 4, "ip saddr": 4, "ip6 daddr": 16, "ip6 saddr": 16, "meta l4proto": 1, "meta nfproto": 1, "th dport": 2, "th sport": 2, "iifname": 16, "oifname": 16}

// setKey writes a key of concatenated fields, each padded to 4 bytes, as
// the field that is looked up writes its values.
func setKey(fields []string, key []byte) string {
	if len(fields) == 1 {
		return nftValue(fields[0], key)
	}
	var parts []string
	for _, f := range fields {
		n := fieldSizes[f]
		if n == 0 || len(key) < n {
			return fmt.Sprintf("0x%x", key) // a field of unknown size: the key as is
		}
		parts = append(parts, nftValue(f, key[:n]))
		key = key[min((n+3)/4*4, len(key)):]
	}
	return strings.Join(parts, " . ")
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

// loaded is what a register holds: a field, perhaps masked, or a value.
type loaded struct {
	desc   string // as nft writes it: "ip daddr", "meta mark & 0xff"
	field  string // the field alone, to format what it is compared with
	prefix int    // bits of an address kept by a mask; -1 for none
	ctMask []byte // ct state's mask: compared with 0, it names the states
}

// ruleset is what rendering a table's rules needs beyond each rule.
type ruleset struct {
	// keys records the fields each set is looked up by, which stand for
	// a set's type where the kernel's answer does not tell it.
	keys map[string][]string
	// elems are the elements of each set, by name: an anonymous set's
	// are written inline.
	elems map[string][]nftables.SetElement
}

// render follows what each register holds, as nft does to print a
// load and a comparison as one match ("ip daddr 10.96.0.1"), and the loads
// into consecutive registers before a lookup as one concatenation
// ("ip daddr . meta l4proto . th dport vmap @services").
func (rs *ruleset) render(exprs []expr.Any) string {
	regs := map[uint32]loaded{}
	var pending []uint32 // registers loaded since the last match, in order
	load := func(reg uint32, l loaded) {
		regs[reg] = l
		pending = append(pending, reg)
	}
	// key is the concatenation of the loads from reg on.
	key := func(reg uint32, set string) string {
		var parts, fields []string
		for i, r := range pending {
			if r == reg {
				for _, r := range pending[i:] {
					parts = append(parts, regs[r].desc)
					fields = append(fields, regs[r].field)
				}
				break
			}
		}
		pending = nil
		if len(parts) == 0 {
			parts, fields = []string{regs[reg].desc}, []string{regs[reg].field}
		}
		rs.keys[set] = fields
		return strings.Join(parts, " . ")
	}
	var out []string
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			name := metaKeys[e.Key]
			if name == "" {
				name = "meta " + strconv.Itoa(int(e.Key))
			}
			if e.SourceRegister {
				out = append(out, name+" set "+regs[e.Register].desc)
				continue
			}
			load(e.Register, loaded{desc: name, field: name, prefix: -1})
		case *expr.Ct:
			name := ctKeys[e.Key]
			if name == "" {
				name = "ct " + strconv.Itoa(int(e.Key))
			}
			load(e.Register, loaded{desc: name, field: name, prefix: -1})
		case *expr.Payload:
			f := payloadField(e)
			load(e.DestRegister, loaded{desc: f, field: f, prefix: -1})
		case *expr.Bitwise:
			load(e.DestRegister, bitwise(regs[e.SourceRegister], e))
		case *expr.Cmp:
			l := regs[e.Register]
			pending = nil
			switch {
			case l.ctMask != nil && e.Op == expr.CmpOpNeq && allZero(e.Data):
				out = append(out, l.field+" "+ctStates(l.ctMask))
			case l.prefix >= 0:
				out = append(out, l.field+" "+cmpOps[e.Op]+nftValue(l.field, e.Data)+"/"+strconv.Itoa(l.prefix))
			case e.Op == expr.CmpOpEq && l.desc != l.field: // masked: nft writes the ==
				out = append(out, l.desc+" == "+nftValue(l.field, e.Data))
			default:
				out = append(out, l.desc+" "+cmpOps[e.Op]+nftValue(l.field, e.Data))
			}
		case *expr.Lookup:
			k := key(e.SourceRegister, e.SetName)
			set := "@" + e.SetName
			if strings.HasPrefix(e.SetName, "__") { // anonymous: nft writes it inline
				set = "{ " + strings.Join(elementLines(rs.keys[e.SetName], rs.elems[e.SetName]), ", ") + " }"
			}
			switch {
			case e.IsDestRegSet && e.DestRegister == 0: // the verdict register
				out = append(out, k+" vmap "+set)
			case e.IsDestRegSet:
				regs[e.DestRegister] = loaded{desc: k + " map " + set, prefix: -1}
			case e.Invert:
				out = append(out, k+" != "+set)
			default:
				out = append(out, k+" "+set)
			}
		case *expr.Immediate:
			regs[e.Register] = loaded{desc: immediate(e.Data), prefix: -1}
		case *expr.Numgen:
			load(e.Register, loaded{desc: "numgen random mod " + strconv.Itoa(int(e.Modulus)), field: "numgen", prefix: -1})
		case *expr.Counter:
			out = append(out, fmt.Sprintf("counter packets %d bytes %d", e.Packets, e.Bytes))
		case *expr.Masq:
			if e.FullyRandom {
				out = append(out, "masquerade fully-random")
			} else {
				out = append(out, "masquerade")
			}
		case *expr.NAT:
			out = append(out, nat(e, regs))
		case *expr.Reject:
			out = append(out, reject(e))
		case *expr.Verdict:
			out = append(out, verdict(e))
		default:
			out = append(out, strings.ToLower(strings.TrimPrefix(fmt.Sprintf("%T", e), "*expr.")))
		}
	}
	return strings.Join(out, " ")
}

// bitwise describes src masked and xored as nft writes it: a prefix of an
// address, "| bits" to set, "^ bits" to flip, "& mask" to keep.
func bitwise(src loaded, b *expr.Bitwise) loaded {
	out := loaded{field: src.field, prefix: -1}
	ones, orBits := true, len(b.Mask) == len(b.Xor)
	for i, m := range b.Mask {
		ones = ones && m == 0xff
		orBits = orBits && m == ^b.Xor[i]
	}
	keep := allZero(b.Xor)
	switch {
	case keep && strings.HasSuffix(src.field, "addr"):
		if p, ok := maskPrefix(b.Mask); ok {
			out.prefix = p
			out.desc = src.desc + "/" + strconv.Itoa(p)
			return out
		}
		out.desc = src.desc + " & " + hexValue(src.field, b.Mask)
	case keep && src.field == "ct state":
		out.ctMask = b.Mask
		out.desc = src.desc + " & " + hexValue(src.field, b.Mask)
	case keep:
		out.desc = src.desc + " & " + hexValue(src.field, b.Mask)
	case ones:
		out.desc = src.desc + " ^ " + hexValue(src.field, b.Xor)
	case orBits:
		out.desc = src.desc + " | " + hexValue(src.field, b.Xor)
	default:
		out.desc = src.desc + " & " + hexValue(src.field, b.Mask) + " ^ " + hexValue(src.field, b.Xor)
	}
	return out
}

// maskPrefix tells whether mask keeps the first bits of an address only.
func maskPrefix(mask []byte) (int, bool) {
	n, done := 0, false
	for _, m := range mask {
		for bit := 7; bit >= 0; bit-- {
			set := m&(1<<bit) != 0
			if set && done {
				return 0, false
			}
			if set {
				n++
			} else {
				done = true
			}
		}
	}
	return n, true
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// ctStates names the conntrack states of a mask, in host byte order, as
// nft lists them.
func ctStates(mask []byte) string {
	if len(mask) != 4 {
		return fmt.Sprintf("0x%x", mask)
	}
	bits := binary.NativeEndian.Uint32(mask)
	var names []string
	for _, s := range []struct {
		bit  uint32
		name string
	}{{1, "invalid"}, {2, "established"}, {4, "related"}, {8, "new"}, {64, "untracked"}} {
		if bits&s.bit != 0 {
			names = append(names, s.name)
			bits &^= s.bit
		}
	}
	if bits != 0 {
		names = append(names, fmt.Sprintf("0x%x", bits))
	}
	return strings.Join(names, ",")
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

// hostOrder are the fields the kernel keeps in host byte order.
var hostOrder = map[string]bool{"meta mark": true, "ct mark": true, "ct state": true, "ct status": true, "meta skuid": true}

// hexValue writes data in hex, as a number where the field is one.
func hexValue(field string, data []byte) string {
	if hostOrder[field] && len(data) == 4 {
		return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(data))
	}
	return fmt.Sprintf("0x%x", data)
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
	case field == "numgen" && len(data) == 4:
		return strconv.FormatUint(uint64(binary.NativeEndian.Uint32(data)), 10)
	case field == "iifname" || field == "oifname":
		return strconv.Quote(strings.TrimRight(string(data), "\x00"))
	}
	return hexValue(field, data)
}

// immediate writes a value loaded into a register for a NAT: an address
// or a port.
func immediate(data []byte) string {
	switch len(data) {
	case 4, 16:
		a, _ := netip.AddrFromSlice(data)
		return a.String()
	case 2:
		return strconv.Itoa(int(binary.BigEndian.Uint16(data)))
	}
	return fmt.Sprintf("0x%x", data)
}

// nat writes a dnat or snat as nft does: "dnat ip to 10.244.1.5:8080".
func nat(n *expr.NAT, regs map[uint32]loaded) string {
	kind := "snat"
	if n.Type == expr.NATTypeDestNAT {
		kind = "dnat"
	}
	family := map[uint32]string{unix.NFPROTO_IPV4: " ip", unix.NFPROTO_IPV6: " ip6"}[n.Family]
	to := regs[n.RegAddrMin].desc
	if n.RegProtoMin != 0 {
		if n.Family == unix.NFPROTO_IPV6 {
			to = "[" + to + "]"
		}
		to += ":" + regs[n.RegProtoMin].desc
	}
	return kind + family + " to " + to
}

// reject writes how a reject answers, as nft does.
func reject(r *expr.Reject) string {
	switch r.Type {
	case unix.NFT_REJECT_TCP_RST:
		return "reject with tcp reset"
	case unix.NFT_REJECT_ICMPX_UNREACH:
		if name, ok := map[uint8]string{unix.NFT_REJECT_ICMPX_NO_ROUTE: "no-route", unix.NFT_REJECT_ICMPX_PORT_UNREACH: "port-unreachable", unix.NFT_REJECT_ICMPX_HOST_UNREACH: "host-unreachable", unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED: "admin-prohibited"}[r.Code]; ok {
			return "reject with icmpx " + name
		}
	}
	return "reject"
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
