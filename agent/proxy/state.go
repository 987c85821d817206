package proxy

import (
	"maps"
	"net/netip"
	"slices"
)

// state is the table as the proxier last wrote it, kept per Service: a
// change to one Service is diffed against that Service's fragment alone,
// so it costs what the Service has, not what the cluster has.
type state struct {
	fixed    *table               // the fixed chains, and the shared sets without Services' elements
	services map[string]*fragment // by namespace/name
	// owners says whose each shared element is: two Services cannot both
	// have one key (say, an external IP and port), and the first keeps it.
	owners  map[ownedKey]string
	hairpin map[netip.Addr]int // endpoint address -> fragments that have it
	// The Services' chains, rules and elements, counted as fragments come
	// and go: a sync reports them without walking every Service.
	chains, rules, elems int
}

type ownedKey struct {
	set string
	key elemKey
}

func newState(mc modelConfig) *state {
	return &state{
		fixed:    fixedTable(mc),
		services: map[string]*fragment{},
		owners:   map[ownedKey]string{},
		hairpin:  map[netip.Addr]int{},
	}
}

// put makes fr the fragment of the Service svc, which has none. Elements
// that another Service has are left out of fr and returned.
func (s *state) put(svc string, fr *fragment) (conflicts []setElem) {
	kept := fr.elems[:0]
	for _, e := range fr.elems {
		k := ownedKey{e.set, e.key}
		if owner, ok := s.owners[k]; ok && owner != svc {
			conflicts = append(conflicts, e)
			continue
		}
		s.owners[k] = svc
		kept = append(kept, e)
	}
	fr.elems = kept
	for _, a := range fr.hairpin {
		s.hairpin[a]++
	}
	s.services[svc] = fr
	s.count(fr, 1)
	return conflicts
}

// remove takes the Service svc's fragment out, if it has one.
func (s *state) remove(svc string) *fragment {
	fr := s.services[svc]
	if fr == nil {
		return nil
	}
	for _, e := range fr.elems {
		k := ownedKey{e.set, e.key}
		if s.owners[k] == svc {
			delete(s.owners, k)
		}
	}
	for _, a := range fr.hairpin {
		if s.hairpin[a]--; s.hairpin[a] <= 0 {
			delete(s.hairpin, a)
		}
	}
	delete(s.services, svc)
	s.count(fr, -1)
	return fr
}

// count adds the fragment's chains, rules and elements to the totals,
// sign times.
func (s *state) count(fr *fragment, sign int) {
	s.chains += sign * len(fr.chains)
	for _, c := range fr.chains {
		s.rules += sign * len(c.rules)
	}
	s.elems += sign * len(fr.elems)
}

// table is the whole table the state stands for.
func (s *state) table() *table {
	t := s.fixed.copySets()
	for _, fr := range s.services {
		t.addFragment(fr)
	}
	t.addHairpin(maps.Keys(s.hairpin))
	return t
}

// change replaces the fragments of the Services in next (nil: the Service
// is gone) and returns the part of the table before and after that the
// change concerns: those Services' chains, sets and elements, and the
// hairpin elements whose presence may change. A plan between the two is
// the transaction for the change. conflicts has, per Service, the
// elements left out because another Service has them.
func (s *state) change(next map[string]*fragment) (before, after *table, conflicts map[string][]setElem) {
	before, after = s.fixed.emptySets(), s.fixed.emptySets()
	addrs := map[netip.Addr]bool{}
	for svc, fr := range next {
		if old := s.services[svc]; old != nil {
			before.addFragment(old)
			for _, a := range old.hairpin {
				addrs[a] = true
			}
		}
		if fr != nil {
			for _, a := range fr.hairpin {
				addrs[a] = true
			}
		}
	}
	before.addHairpin(func(yield func(netip.Addr) bool) {
		for a := range addrs {
			if s.hairpin[a] > 0 && !yield(a) {
				return
			}
		}
	})
	keys := slices.Sorted(maps.Keys(next))
	for _, svc := range keys {
		s.remove(svc)
	}
	for _, svc := range keys {
		fr := next[svc]
		if fr == nil {
			continue
		}
		if c := s.put(svc, fr); len(c) > 0 {
			if conflicts == nil {
				conflicts = map[string][]setElem{}
			}
			conflicts[svc] = c
		}
		after.addFragment(fr)
	}
	after.addHairpin(func(yield func(netip.Addr) bool) {
		for a := range addrs {
			if s.hairpin[a] > 0 && !yield(a) {
				return
			}
		}
	})
	return before, after, conflicts
}

// emptySets is a table with t's sets, without elements, and no chains.
func (t *table) emptySets() *table {
	out := newTable()
	for name, st := range t.sets {
		c := *st
		c.elems = map[elemKey]verdict{}
		out.sets[name] = &c
	}
	return out
}

// copySets is a table with t's chains and copies of its sets.
func (t *table) copySets() *table {
	out := newTable()
	maps.Copy(out.chains, t.chains)
	for name, st := range t.sets {
		c := *st
		c.elems = maps.Clone(st.elems)
		out.sets[name] = &c
	}
	return out
}

func (t *table) addFragment(fr *fragment) {
	for _, c := range fr.chains {
		t.chains[c.name] = c
	}
	for _, st := range fr.sets {
		t.sets[st.name] = st
	}
	for _, e := range fr.elems {
		t.sets[e.set].elems[e.key] = e.val
	}
}

func (t *table) addHairpin(addrs func(yield func(netip.Addr) bool)) {
	for a := range addrs {
		t.sets[famName(setHairpin, familyOf(a))].elems[elemKey{addr: a}] = verdict{}
	}
}

// ports is what conntrack cleanup needs of every service port.
func (s *state) ports() map[string]portState {
	all := make([]map[string]portState, 0, len(s.services))
	for _, fr := range s.services {
		all = append(all, fr.ports)
	}
	return union(all)
}

// counts returns the number of chains, rules and static set elements.
func (s *state) counts() (chains, rules, elems int) {
	rules, elems = s.fixed.counts()
	return len(s.fixed.chains) + s.chains, rules + s.rules, elems + s.elems + len(s.hairpin)
}

func union[K comparable, V any](ms []map[K]V) map[K]V {
	out := map[K]V{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}
