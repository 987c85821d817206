package proxy

import (
	"encoding/base32"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The model is the desired content of the table as plain data: chains of
// rules, and sets and verdict maps with their elements. It knows nothing of
// netlink; nft_linux.go compiles it. Its String form is nft's syntax, so a
// golden file reads like `nft list table inet cairn`.

type verdictKind uint8

const (
	vNone verdictKind = iota
	vAccept
	vDrop
	vReturn
	vJump
	vGoto
)

type verdict struct {
	kind  verdictKind
	chain string
}

func jump(c string) verdict    { return verdict{vJump, c} }
func goTo(c string) verdict    { return verdict{vGoto, c} }
func (v verdict) isZero() bool { return v.kind == vNone }

func (v verdict) String() string {
	switch v.kind {
	case vAccept:
		return "accept"
	case vDrop:
		return "drop"
	case vReturn:
		return "return"
	case vJump:
		return "jump " + v.chain
	case vGoto:
		return "goto " + v.chain
	}
	return ""
}

// A term is one match, statement or verdict of a rule.
type term interface{ String() string }

// familyTerm is a term that reads an address, so its rule must first check
// the packet's family (nft adds "meta nfproto" implicitly in inet tables).
type familyTerm interface{ fam() family }

type (
	// tDaddr: ip daddr A
	tDaddr struct {
		f    family
		addr netip.Addr
	}
	// tSaddr: ip saddr [!=] PREFIX
	tSaddr struct {
		f      family
		prefix netip.Prefix
		not    bool
	}
	// tDaddrNet: ip daddr [!=] PREFIX
	tDaddrNet struct {
		f      family
		prefix netip.Prefix
		not    bool
	}
	// tL4proto: meta l4proto P
	tL4proto struct{ p protocol }
	// tDport: th dport N
	tDport struct{ port uint16 }
	// tDportRange: th dport LO-HI
	tDportRange struct{ lo, hi uint16 }
	// tDaddrInSet: ip daddr @S
	tDaddrInSet struct {
		f   family
		set string
	}
	// tSaddrInSet: ip saddr @S
	tSaddrInSet struct {
		f   family
		set string
	}
	// tCtStateNew: ct state new
	tCtStateNew struct{}
	// tCtStateEstablished: ct state established,related
	tCtStateEstablished struct{}
	// tFibSaddrLocal: fib saddr type local
	tFibSaddrLocal struct{}
	// tMarkClear: meta mark & M == 0
	tMarkClear struct{ mask uint32 }
	// sMarkOr: meta mark set meta mark | M
	sMarkOr struct{ mask uint32 }
	// sMarkXor: meta mark set meta mark ^ M
	sMarkXor struct{ mask uint32 }
	// sMasquerade: masquerade fully-random
	sMasquerade struct{}
	// sDNAT: dnat ip to A:N
	sDNAT struct {
		f    family
		addr netip.Addr
		port uint16
	}
	// sUpdateSaddr: update @S { ip saddr }
	sUpdateSaddr struct {
		f   family
		set string
	}
	// sReject: reject with tcp reset | reject with icmpx port-unreachable
	sReject struct{ tcpReset bool }
	// tVerdict: a verdict
	tVerdict struct{ v verdict }
	// tVmapService: ip daddr . meta l4proto . th dport vmap @M
	tVmapService struct {
		f   family
		set string
	}
	// tVmapNodePort: meta l4proto . th dport vmap @M
	tVmapNodePort struct{ set string }
	// tVmapAddr: ip daddr vmap @M, or ip saddr with src
	tVmapAddr struct {
		f   family
		set string
		src bool
	}
	// tDaddrProtoPortInSet: ip daddr . meta l4proto . th dport @S
	tDaddrProtoPortInSet struct {
		f   family
		set string
	}
	// tPairInSet: ip saddr . ip daddr @S (a hairpin: a packet DNATed back
	// to its sender)
	tPairInSet struct {
		f   family
		set string
	}
	// tNumgenZero: numgen random mod N == 0, true once in N
	tNumgenZero struct{ n uint32 }
)

func (t tDaddr) fam() family       { return t.f }
func (t tSaddr) fam() family       { return t.f }
func (t tDaddrNet) fam() family    { return t.f }
func (t tDaddrInSet) fam() family  { return t.f }
func (t tSaddrInSet) fam() family  { return t.f }
func (t sDNAT) fam() family        { return t.f }
func (t sUpdateSaddr) fam() family { return t.f }
func (t tVmapService) fam() family { return t.f }
func (t tPairInSet) fam() family   { return t.f }
func (t tVmapAddr) fam() family    { return t.f }

func (t tDaddrProtoPortInSet) fam() family { return t.f }

func prefixString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

func (t tDaddr) String() string { return t.f.nft() + " daddr " + t.addr.String() }
func (t tSaddr) String() string {
	op := " "
	if t.not {
		op = " != "
	}
	return t.f.nft() + " saddr" + op + prefixString(t.prefix)
}
func (t tDaddrNet) String() string {
	if t.not {
		return t.f.nft() + " daddr != " + prefixString(t.prefix)
	}
	return t.f.nft() + " daddr " + prefixString(t.prefix)
}
func (t tDportRange) String() string       { return fmt.Sprintf("th dport %d-%d", t.lo, t.hi) }
func (tCtStateEstablished) String() string { return "ct state established,related" }
func (t tVmapAddr) String() string {
	if t.src {
		return t.f.nft() + " saddr vmap @" + t.set
	}
	return t.f.nft() + " daddr vmap @" + t.set
}
func (t tDaddrProtoPortInSet) String() string {
	return t.f.nft() + " daddr . meta l4proto . th dport @" + t.set
}
func (t tL4proto) String() string     { return "meta l4proto " + t.p.String() }
func (t tDport) String() string       { return "th dport " + strconv.Itoa(int(t.port)) }
func (t tDaddrInSet) String() string  { return t.f.nft() + " daddr @" + t.set }
func (t tSaddrInSet) String() string  { return t.f.nft() + " saddr @" + t.set }
func (tCtStateNew) String() string    { return "ct state new" }
func (tFibSaddrLocal) String() string { return "fib saddr type local" }
func (t tMarkClear) String() string   { return fmt.Sprintf("meta mark & %#08x == 0", t.mask) }
func (t sMarkOr) String() string      { return fmt.Sprintf("meta mark set meta mark | %#08x", t.mask) }
func (t sMarkXor) String() string     { return fmt.Sprintf("meta mark set meta mark ^ %#08x", t.mask) }
func (sMasquerade) String() string    { return "masquerade fully-random" }
func (t sDNAT) String() string {
	return "dnat " + t.f.nft() + " to " + netip.AddrPortFrom(t.addr, t.port).String()
}
func (t sUpdateSaddr) String() string { return "update @" + t.set + " { " + t.f.nft() + " saddr }" }
func (t tVerdict) String() string     { return t.v.String() }
func (t tVmapService) String() string {
	return t.f.nft() + " daddr . meta l4proto . th dport vmap @" + t.set
}
func (t tVmapNodePort) String() string { return "meta l4proto . th dport vmap @" + t.set }
func (t sReject) String() string {
	if t.tcpReset {
		return "reject with tcp reset"
	}
	return "reject with icmpx port-unreachable"
}
func (t tPairInSet) String() string {
	return fmt.Sprintf("%s saddr . %s daddr @%s", t.f.nft(), t.f.nft(), t.set)
}
func (t tNumgenZero) String() string { return fmt.Sprintf("numgen random mod %d == 0", t.n) }

type rule []term

func (r rule) String() string {
	s := make([]string, len(r))
	for i, t := range r {
		s[i] = t.String()
	}
	return strings.Join(s, " ")
}

func (r rule) family() (family, bool) {
	for _, t := range r {
		if ft, ok := t.(familyTerm); ok {
			return ft.fam(), true
		}
	}
	return 0, false
}

// hook makes a chain a base chain.
type hook struct {
	typ      string // nat or filter
	hook     string // prerouting, output, postrouting
	priority int32
}

type chain struct {
	name  string
	hook  *hook // nil: a regular chain
	rules []rule
	// sealed: the name ends in a digest of the rules (sealedName), so a
	// chain of this name in the kernel holds these rules and is never
	// rewritten, only added and deleted. A Service's chains are sealed;
	// the fixed ones are not, and their rules carry their digests as
	// comments for a full sync to compare (tags).
	sealed bool
	// tags are the rule digests of a chain read back from the kernel, in
	// order; nil when its rules were not read.
	tags []string
}

// sameRules tells whether two chains hold the same rules.
func (c *chain) sameRules(o *chain) bool {
	return slices.EqualFunc(c.rules, o.rules, func(a, b rule) bool { return a.String() == b.String() })
}

func (c *chain) sameHook(o *chain) bool {
	if c.hook == nil || o.hook == nil {
		return c.hook == o.hook
	}
	return *c.hook == *o.hook
}

// digest is a short, printable hash of some text.
func digest(text string) string {
	h := fnv.New64a()
	h.Write([]byte(text))
	return base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(h.Sum(nil))[:8]
}

// ruleTag is the digest a fixed chain's rule carries as its comment.
func ruleTag(r rule) string { return digest(r.String()) }

// sealedName names a chain kind-family-digest-what, the digest over its
// rules: svc4-0123abcd-ns/web/tcp/http.
func sealedName(kind string, f family, what string, rules []rule) string {
	var b strings.Builder
	for _, r := range rules {
		b.WriteString(r.String())
		b.WriteByte('\n')
	}
	return fmt.Sprintf("%s%d-%s-%s", kind, f, strings.ToLower(digest(b.String())), what)
}

// keyField is one part of a set's key.
type keyField uint8

const (
	kAddr4 keyField = iota
	kAddr6
	kProto
	kPort
)

func (k keyField) String() string {
	return [...]string{"ipv4_addr", "ipv6_addr", "inet_proto", "inet_service"}[k]
}

// size is the field's length in bytes, unpadded.
func (k keyField) size() uint32 { return [...]uint32{4, 16, 1, 2}[k] }

func addrField(f family) keyField {
	if f == ipv4 {
		return kAddr4
	}
	return kAddr6
}

// fieldsLen is the length in bytes of a key or value of the given fields as
// the kernel stores it: a lone field at its own size, each field of a
// concatenation padded to 4 bytes.
func fieldsLen(fields []keyField) uint32 {
	if len(fields) == 1 {
		return fields[0].size()
	}
	var n uint32
	for _, f := range fields {
		n += (f.size() + 3) / 4 * 4
	}
	return n
}

// elemKey is a set element's key; its set's key fields say which of these
// count. An address field repeated in a key (a hairpin pair) holds addr.
type elemKey struct {
	addr  netip.Addr
	proto protocol
	port  uint16
}

// String shows the fields that are set.
func (k elemKey) String() string {
	var parts []string
	if k.addr.IsValid() {
		parts = append(parts, k.addr.String())
	}
	if k.proto != 0 {
		parts = append(parts, k.proto.String())
	}
	if k.port != 0 {
		parts = append(parts, strconv.Itoa(int(k.port)))
	}
	return strings.Join(parts, " . ")
}

func (k elemKey) format(fields []keyField) string {
	parts := make([]string, len(fields))
	for i, f := range fields {
		switch f {
		case kAddr4, kAddr6:
			parts[i] = k.addr.String()
		case kProto:
			parts[i] = k.proto.String()
		case kPort:
			parts[i] = strconv.Itoa(int(k.port))
		}
	}
	return strings.Join(parts, " . ")
}

// set is a named set, or with isMap a verdict map. A set with a timeout is
// dynamic: the ruleset adds its elements (session affinity) and the
// programmer never writes them.
type set struct {
	name    string
	key     []keyField
	isMap   bool
	timeout time.Duration
	elems   map[elemKey]verdict

	// observedKeyLen is the key length of a set read back from the kernel
	// before its key fields are known.
	observedKeyLen uint32
}

// sameType tells whether o can stand for s without being recreated.
func (s *set) sameType(o *set) bool {
	if s.isMap != o.isMap || s.timeout != o.timeout {
		return false
	}
	if s.key == nil || o.key == nil {
		// github.com/google/nftables v0.3.0 reads a verdict map's key type
		// back as "verdict" with no length: then the name, which differs
		// between layouts and families, has to do.
		a, b := s.keyLen(), o.keyLen()
		return a == b || (s.isMap && (a == 0 || b == 0))
	}
	return slices.Equal(s.key, o.key)
}

// keyLen is the key's length in bytes as the kernel stores it.
func (s *set) keyLen() uint32 {
	if s.key == nil {
		return s.observedKeyLen
	}
	return fieldsLen(s.key)
}

func sortKeys(keys []elemKey) {
	slices.SortFunc(keys, func(a, b elemKey) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		if a.proto != b.proto {
			return int(a.proto) - int(b.proto)
		}
		return int(a.port) - int(b.port)
	})
}

// table is the whole desired (or last written) content of the table.
type table struct {
	chains map[string]*chain
	sets   map[string]*set
}

func newTable() *table {
	return &table{chains: map[string]*chain{}, sets: map[string]*set{}}
}

func (t *table) addChain(name string, h *hook, rules ...rule) *chain {
	c := &chain{name: name, hook: h, rules: rules}
	t.chains[name] = c
	return c
}

func (t *table) addSet(name string, isMap bool, timeout time.Duration, key ...keyField) *set {
	s := &set{name: name, key: key, isMap: isMap, timeout: timeout, elems: map[elemKey]verdict{}}
	t.sets[name] = s
	return s
}

// counts returns the number of rules and of static set elements.
func (t *table) counts() (rules, elems int) {
	for _, c := range t.chains {
		rules += len(c.rules)
	}
	for _, s := range t.sets {
		elems += len(s.elems)
	}
	return rules, elems
}

// String renders the table in nft's syntax, sorted, for golden files and
// error messages.
func (t *table) String() string {
	var b strings.Builder
	b.WriteString("table inet cairn {\n")
	for _, name := range sortedKeys(t.sets) {
		s := t.sets[name]
		kind := "set"
		if s.isMap {
			kind = "map"
		}
		fmt.Fprintf(&b, "\t%s %s {\n\t\ttype %s", kind, name, fieldsString(s.key))
		if s.isMap {
			b.WriteString(" : verdict")
		}
		b.WriteString("\n")
		if s.timeout > 0 {
			fmt.Fprintf(&b, "\t\tflags dynamic,timeout\n\t\ttimeout %ds\n", int(s.timeout.Seconds()))
		}
		if len(s.elems) > 0 {
			var elems []string
			for k, v := range s.elems {
				e := k.format(s.key)
				if s.isMap {
					e += " : " + v.String()
				}
				elems = append(elems, e)
			}
			slices.Sort(elems)
			fmt.Fprintf(&b, "\t\telements = {\n\t\t\t%s,\n\t\t}\n", strings.Join(elems, ",\n\t\t\t"))
		}
		b.WriteString("\t}\n")
	}
	for _, name := range sortedKeys(t.chains) {
		c := t.chains[name]
		fmt.Fprintf(&b, "\tchain %s {\n", name)
		if c.hook != nil {
			fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d\n", c.hook.typ, c.hook.hook, c.hook.priority)
		}
		for _, r := range c.rules {
			fmt.Fprintf(&b, "\t\t%s\n", r)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func fieldsString(fields []keyField) string {
	s := make([]string, len(fields))
	for i, f := range fields {
		s[i] = f.String()
	}
	return strings.Join(s, " . ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
