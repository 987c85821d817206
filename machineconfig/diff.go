package machineconfig

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// ChangeKind says how a field differs between two configs.
type ChangeKind int

// Kinds of Change.
const (
	Modified ChangeKind = iota
	Added
	Removed
)

// Change is one difference between two machine configs.
type Change struct {
	// Path is the field's path, spelled as in validation errors:
	// machine.hostname, network.interfaces[0].addresses[1],
	// cluster.nodeLabels["rack"], machine.staticPods[0].spec.containers[0].image.
	// A removed list item has its index in the old list, any other change
	// its index in the new one.
	Path string
	Kind ChangeKind
	// Old and New are the values, as their JSON; Old is nil when added,
	// New when removed.
	Old, New json.RawMessage
}

// secretPaths are fields whose values a diff never shows.
var secretPaths = map[string]bool{
	"machine.api.key":        true,
	"cluster.bootstrapToken": true,
	"cluster.kubeconfig":     true,
}

// String is the change as one line, e.g. `machine.hostname: "a" → "b"`.
// Secrets are not shown, nor strings too long for a line, which are their
// size and digest.
func (c Change) String() string {
	switch c.Kind {
	case Added:
		return fmt.Sprintf("%s: added %s", c.Path, c.show(c.New))
	case Removed:
		return fmt.Sprintf("%s: removed %s", c.Path, c.show(c.Old))
	}
	return fmt.Sprintf("%s: %s → %s", c.Path, c.show(c.Old), c.show(c.New))
}

func (c Change) show(v json.RawMessage) string {
	if secretPaths[c.Path] {
		return "(secret)"
	}
	var x any
	if err := json.Unmarshal(v, &x); err != nil {
		return string(v)
	}
	out, err := json.Marshal(shorten(x))
	if err != nil {
		return string(v)
	}
	return string(out)
}

// shorten replaces, in a decoded JSON value, the strings too long for a
// line by their size and the start of their SHA-256.
func shorten(x any) any {
	switch x := x.(type) {
	case string:
		if len(x) > 64 {
			sum := sha256.Sum256([]byte(x))
			return fmt.Sprintf("(%d bytes, sha256 %x…)", len(x), sum[:4])
		}
	case map[string]any:
		for k, v := range x {
			x[k] = shorten(v)
		}
	case []any:
		for i, v := range x {
			x[i] = shorten(v)
		}
	}
	return x
}

// Diff returns what differs from old to new, field by field, in the order
// of the fields. Both are expected to have their defaults applied, so that
// a default left out and the same value written out are no change.
func Diff(old, new *Config) []Change {
	var d differ
	d.value("", reflect.ValueOf(old).Elem(), reflect.ValueOf(new).Elem())
	return d.changes
}

type differ struct {
	changes []Change
}

var staticPodType = reflect.TypeFor[StaticPod]()

// value compares a and b at path p. An invalid reflect.Value is absent.
func (d *differ) value(p string, a, b reflect.Value) {
	a, b = deref(a), deref(b)
	if !a.IsValid() && !b.IsValid() {
		return
	}
	var t reflect.Type
	if a.IsValid() {
		t = a.Type()
	} else {
		t = b.Type()
	}
	if a.IsValid() && b.IsValid() && a.Type() != b.Type() {
		d.leaf(p, a, b) // JSON of different types
		return
	}
	switch {
	case t == staticPodType:
		d.value(p, decodeJSON(a), decodeJSON(b))
	case t.Kind() == reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			name, omit := jsonName(f)
			if name == "" {
				continue
			}
			d.value(join(p, name), field(a, i, omit), field(b, i, omit))
		}
	case t.Kind() == reflect.Map:
		keys := map[string]bool{}
		for _, v := range []reflect.Value{a, b} {
			if v.IsValid() {
				for _, k := range v.MapKeys() {
					keys[k.String()] = true
				}
			}
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		slices.Sort(sorted)
		for _, k := range sorted {
			// JSON's objects (in static pods) have fields; the config's
			// maps have keys.
			kp := fmt.Sprintf("%s[%q]", p, k)
			if t.Elem().Kind() == reflect.Interface {
				kp = join(p, k)
			}
			d.value(kp, mapIndex(a, k), mapIndex(b, k))
		}
	case t.Kind() == reflect.Slice:
		d.list(p, a, b)
	default:
		if !a.IsValid() || !b.IsValid() || !reflect.DeepEqual(a.Interface(), b.Interface()) {
			d.leaf(p, a, b)
		}
	}
}

// list compares two lists along their longest common subsequence. Where
// items of a were dropped and items of b put in at the same place, they
// are paired in order and compared field by field (an edited item, not a
// new one); those left over are removed or added whole.
func (d *differ) list(p string, a, b reflect.Value) {
	n, m := length(a), length(b)
	// lcs[i][j] is the length of the LCS of a[i:] and b[j:].
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if reflect.DeepEqual(a.Index(i).Interface(), b.Index(j).Interface()) {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var removed, added []int
	flush := func() {
		k := min(len(removed), len(added))
		for x := range k {
			d.value(fmt.Sprintf("%s[%d]", p, added[x]), a.Index(removed[x]), b.Index(added[x]))
		}
		for _, i := range removed[k:] {
			d.leaf(fmt.Sprintf("%s[%d]", p, i), a.Index(i), reflect.Value{})
		}
		for _, j := range added[k:] {
			d.leaf(fmt.Sprintf("%s[%d]", p, j), reflect.Value{}, b.Index(j))
		}
		removed, added = removed[:0], added[:0]
	}
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && reflect.DeepEqual(a.Index(i).Interface(), b.Index(j).Interface()):
			flush()
			i, j = i+1, j+1
		case j == m || (i < n && lcs[i+1][j] >= lcs[i][j+1]):
			removed = append(removed, i)
			i++
		default:
			added = append(added, j)
			j++
		}
	}
	flush()
}

// leaf records a change of a whole value at p.
func (d *differ) leaf(p string, a, b reflect.Value) {
	c := Change{Path: p, Old: marshal(a), New: marshal(b)}
	switch {
	case !a.IsValid():
		c.Kind = Added
	case !b.IsValid():
		c.Kind = Removed
	}
	d.changes = append(d.changes, c)
}

func marshal(v reflect.Value) json.RawMessage {
	if !v.IsValid() {
		return nil
	}
	out, err := json.Marshal(v.Interface())
	if err != nil {
		return json.RawMessage(fmt.Sprintf("%q", fmt.Sprint(v.Interface())))
	}
	return out
}

// deref follows pointers and interfaces; nil ones are absent.
func deref(v reflect.Value) reflect.Value {
	for v.IsValid() && (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) {
		if v.IsNil() {
			return reflect.Value{}
		}
		v = v.Elem()
	}
	return v
}

// decodeJSON decodes a static pod's manifest, to be compared field by
// field; one that does not decode is compared whole, as a string.
func decodeJSON(v reflect.Value) reflect.Value {
	if !v.IsValid() || v.Len() == 0 {
		return reflect.Value{}
	}
	var x any
	if err := json.Unmarshal(v.Bytes(), &x); err != nil {
		return reflect.ValueOf(string(v.Bytes()))
	}
	return reflect.ValueOf(x)
}

// field is struct v's field i, absent when v is or when it is empty and
// its JSON leaves it out (omit).
func field(v reflect.Value, i int, omit bool) reflect.Value {
	if !v.IsValid() {
		return reflect.Value{}
	}
	f := v.Field(i)
	if omit && f.IsZero() {
		return reflect.Value{}
	}
	if f.Kind() == reflect.Slice && f.Len() == 0 || f.Kind() == reflect.Map && f.Len() == 0 {
		return reflect.Value{}
	}
	return f
}

func mapIndex(v reflect.Value, k string) reflect.Value {
	if !v.IsValid() {
		return reflect.Value{}
	}
	return v.MapIndex(reflect.ValueOf(k).Convert(v.Type().Key()))
}

func length(v reflect.Value) int {
	if !v.IsValid() {
		return 0
	}
	return v.Len()
}

// jsonName is f's name in JSON ("" if it has none) and whether JSON leaves
// it out when empty.
func jsonName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	tag := f.Tag.Get("json")
	if tag == "-" {
		return "", false
	}
	name, opts, _ := strings.Cut(tag, ",")
	if name == "" {
		name = f.Name
	}
	return name, strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")
}

func join(p, name string) string {
	if p == "" {
		return name
	}
	return p + "." + name
}
