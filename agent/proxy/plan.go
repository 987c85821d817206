package proxy

import (
	"fmt"
	"slices"
	"strings"
)

// A plan is what one transaction does to turn the table from one state into
// another. The programmer sends it in this order, as one netlink batch that
// the kernel applies atomically or not at all:
//
//  1. delete map elements that went away or changed verdict
//  2. flush chains whose rules change or that go away
//  3. delete chains that go away
//  4. delete sets that go away or change type
//  5. add new chains
//  6. add new sets
//  7. write the rules of new and changed chains
//  8. add new map elements
//
// Deletions come first so that nothing still refers to what is deleted.
type plan struct {
	delElems    map[string][]elemKey // set name -> keys
	flushChains []string
	delChains   []string
	delSets     []string
	addChains   []*chain
	addSets     []*set
	writeRules  []*chain
	addElems    map[string]map[elemKey]verdict
	// sets has the definitions of the sets whose elements the plan
	// changes, for their key and value fields.
	sets map[string]*set
}

func (p *plan) empty() bool {
	return len(p.delElems) == 0 && len(p.flushChains) == 0 && len(p.delChains) == 0 && len(p.delSets) == 0 &&
		len(p.addChains) == 0 && len(p.addSets) == 0 && len(p.writeRules) == 0 && len(p.addElems) == 0
}

// String lists the plan's operations, one a line, for tests and logs.
func (p *plan) String() string {
	var lines []string
	for _, s := range sortedKeys(p.delElems) {
		for _, k := range p.delElems[s] {
			lines = append(lines, fmt.Sprintf("delete element %s %v", s, k))
		}
	}
	for _, c := range p.flushChains {
		lines = append(lines, "flush chain "+c)
	}
	for _, c := range p.delChains {
		lines = append(lines, "delete chain "+c)
	}
	for _, s := range p.delSets {
		lines = append(lines, "delete set "+s)
	}
	for _, c := range p.addChains {
		lines = append(lines, "add chain "+c.name)
	}
	for _, s := range p.addSets {
		lines = append(lines, "add set "+s.name)
	}
	for _, c := range p.writeRules {
		lines = append(lines, fmt.Sprintf("write chain %s (%d rules)", c.name, len(c.rules)))
	}
	for _, s := range sortedKeys(p.addElems) {
		for k, v := range p.addElems[s] {
			lines = append(lines, fmt.Sprintf("add element %s %v %v", s, k, v))
		}
	}
	return strings.Join(lines, "\n")
}

// touched lists the names of the chains and sets the plan changes.
func (p *plan) touched() []string {
	var names []string
	names = append(names, sortedKeys(p.delElems)...)
	names = append(names, p.flushChains...)
	names = append(names, p.delChains...)
	names = append(names, p.delSets...)
	for _, c := range p.addChains {
		names = append(names, c.name)
	}
	for _, s := range p.addSets {
		names = append(names, s.name)
	}
	for _, c := range p.writeRules {
		names = append(names, c.name)
	}
	names = append(names, sortedKeys(p.addElems)...)
	slices.Sort(names)
	return slices.Compact(names)
}

// refs lists the sets and maps a rule names.
func (r rule) refs() []string {
	var out []string
	for _, t := range r {
		switch t := t.(type) {
		case tDaddrInSet:
			out = append(out, t.set)
		case tSaddrInSet:
			out = append(out, t.set)
		case sUpdateSaddr:
			out = append(out, t.set)
		case tVmapService:
			out = append(out, t.set)
		case tVmapNodePort:
			out = append(out, t.set)
		case tPairInSet:
			out = append(out, t.set)
		}
	}
	return out
}

func (c *chain) refs(set string) bool {
	for _, r := range c.rules {
		if slices.Contains(r.refs(), set) {
			return true
		}
	}
	return false
}

// makePlan diffs old (what the kernel has) against want. With full, old
// was read back from the kernel: a sealed chain of the same name holds
// the same rules (its name says so), and another is rewritten unless the
// digests its rules carry (tags) are want's. Elements of dynamic sets
// (session affinity) are the kernel's and never touched.
func makePlan(old, want *table, full bool) *plan {
	p := &plan{delElems: map[string][]elemKey{}, addElems: map[string]map[elemKey]verdict{}, sets: want.sets}
	if old == nil {
		old = newTable()
		full = true
	}

	// Sets that must be created (new, or of another type than the kernel's).
	recreate := map[string]bool{}
	for _, name := range sortedKeys(want.sets) {
		ws := want.sets[name]
		os, ok := old.sets[name]
		if !ok || !ws.sameType(os) {
			recreate[name] = true
			if ok {
				p.delSets = append(p.delSets, name)
			}
			p.addSets = append(p.addSets, ws)
			continue
		}
		if ws.timeout > 0 {
			continue // dynamic: elements belong to the kernel
		}
		var del []elemKey
		add := map[elemKey]verdict{}
		for k, v := range os.elems {
			if nv, ok := ws.elems[k]; !ok || nv != v {
				del = append(del, k)
			}
		}
		for k, v := range ws.elems {
			if ov, ok := os.elems[k]; !ok || ov != v {
				add[k] = v
			}
		}
		if len(del) > 0 {
			sortKeys(del)
			p.delElems[name] = del
		}
		if len(add) > 0 {
			p.addElems[name] = add
		}
	}
	for _, name := range sortedKeys(old.sets) {
		if _, ok := want.sets[name]; !ok {
			p.delSets = append(p.delSets, name)
			recreate[name] = true // so chains that use it are flushed first
		}
	}
	// A chain must be rewritten when its rules differ, when the kernel's
	// rules are unknown (full), or when a set it uses is recreated.
	usesRecreated := func(c *chain) bool {
		if len(recreate) == 0 {
			return false
		}
		for s := range recreate {
			if c.refs(s) {
				return true
			}
		}
		return false
	}
	for _, name := range sortedKeys(old.chains) {
		oc := old.chains[name]
		wc, ok := want.chains[name]
		switch {
		case !ok || !wc.sameHook(oc):
			p.flushChains = append(p.flushChains, name)
			p.delChains = append(p.delChains, name)
		case usesRecreated(oc) || usesRecreated(wc) || !sameContent(oc, wc, full):
			p.flushChains = append(p.flushChains, name)
			p.writeRules = append(p.writeRules, wc)
		}
	}
	for _, name := range sortedKeys(want.chains) {
		wc := want.chains[name]
		if oc, ok := old.chains[name]; !ok || !wc.sameHook(oc) {
			p.addChains = append(p.addChains, wc)
			p.writeRules = append(p.writeRules, wc)
		}
	}
	// Base chains (the hooks into the packet path) are added last and
	// deleted first, so a half-built table is never reachable; within one
	// transaction this only matters for readability of the plan.
	slices.SortStableFunc(p.addChains, func(a, b *chain) int { return boolCmp(a.hook != nil, b.hook != nil) })
	return p
}

// sameContent tells whether the chain old (read back from the kernel if
// full) holds want's rules.
func sameContent(old, want *chain, full bool) bool {
	switch {
	case want.sealed:
		return true
	case full:
		return slices.EqualFunc(old.tags, want.rules, func(tag string, r rule) bool { return tag == ruleTag(r) })
	}
	return want.sameRules(old)
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
