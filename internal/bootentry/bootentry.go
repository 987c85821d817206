// Package bootentry is systemd-boot's view of the UKIs in the EFI system
// partition's EFI/Linux: their file names with the boot counter
// (NAME+LEFT-DONE.efi), the order of their versions, and what a UKI file
// declares about itself (its .osrel). Init uses it to write, bless and
// roll back UKIs; the CLI to check a UKI before it sends it.
package bootentry

import (
	"bufio"
	"bytes"
	"debug/pe"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// Dir is where systemd-boot finds UKIs, from the ESP's root.
const Dir = "EFI/Linux"

// Prefix starts the name of every Cairn UKI: "cairn-" then its version.
const Prefix = "cairn-"

// DefaultTries is how many boots a new UKI gets to become healthy before
// systemd-boot goes back to the previous one.
const DefaultTries = 3

// MediaType is the media type of the layer that is a UKI in an OCI
// artifact, for upgrades pulled from a registry.
const MediaType = "application/vnd.cairn.uki.v1"

// An Entry is a UKI's file name, parsed.
type Entry struct {
	// Version is the name between Prefix and the counter.
	Version string
	// Counting is set while the entry is on trial: its name carries a
	// boot counter.
	Counting bool
	// Left and Done are the counter's boots left and boots made.
	Left, Done int
}

// validVersion is what a version may hold: it goes into a file name on
// FAT and systemd-boot reads '+' as the counter's start.
var validVersion = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._~^-]*$`)

// counter is the boot counter at the end of a name: +LEFT or +LEFT-DONE.
var counter = regexp.MustCompile(`\+(\d+)(?:-(\d+))?$`)

// CheckVersion says why v cannot name a UKI, or nil.
func CheckVersion(v string) error {
	if !validVersion.MatchString(v) || len(v) > 64 {
		return fmt.Errorf("version %q: must be at most 64 letters, digits and ._~^- starting with a letter or digit", v)
	}
	return nil
}

// Parse reads a file name of EFI/Linux; ok is false for a name that is
// not a Cairn UKI's.
func Parse(name string) (e Entry, ok bool) {
	base, found := strings.CutSuffix(name, ".efi")
	if !found {
		return Entry{}, false
	}
	base, found = strings.CutPrefix(base, Prefix)
	if !found {
		return Entry{}, false
	}
	if m := counter.FindStringSubmatchIndex(base); m != nil {
		left, err1 := strconv.Atoi(base[m[2]:m[3]])
		done, err2 := 0, error(nil)
		if m[4] >= 0 {
			done, err2 = strconv.Atoi(base[m[4]:m[5]])
		}
		if err1 != nil || err2 != nil {
			return Entry{}, false
		}
		e = Entry{Counting: true, Left: left, Done: done}
		base = base[:m[0]]
	}
	if CheckVersion(base) != nil {
		return Entry{}, false
	}
	e.Version = base
	return e, true
}

// Name is the entry's file name.
func (e Entry) Name() string {
	switch {
	case !e.Counting:
		return Prefix + e.Version + ".efi"
	case e.Done == 0:
		return fmt.Sprintf("%s%s+%d.efi", Prefix, e.Version, e.Left)
	default:
		return fmt.Sprintf("%s%s+%d-%d.efi", Prefix, e.Version, e.Left, e.Done)
	}
}

// Bad reports whether systemd-boot has given up on the entry: its boots
// ran out, and it sorts after every other.
func (e Entry) Bad() bool { return e.Counting && e.Left == 0 }

// Blessed is the entry without its counter: kept for good.
func (e Entry) Blessed() Entry { return Entry{Version: e.Version} }

// New is a new entry of version v with tries boots to become healthy.
func New(v string, tries int) Entry { return Entry{Version: v, Counting: true, Left: tries} }

// Info is what a UKI declares in its .osrel section.
type Info struct {
	// Version is IMAGE_VERSION, else VERSION_ID: what systemd-boot orders
	// UKIs by.
	Version string
	// ID is the os-release ID; Cairn's is "cairn".
	ID string
}

// ReadUKI checks that r holds a UKI — a PE32+ image with the sections
// .osrel, .cmdline, .linux and .initrd — and returns its .osrel's
// version.
func ReadUKI(r io.ReaderAt) (Info, error) {
	f, err := pe.NewFile(r)
	if err != nil {
		return Info{}, fmt.Errorf("not a UKI: not a PE image: %w", err)
	}
	defer f.Close()
	if _, ok := f.OptionalHeader.(*pe.OptionalHeader64); !ok {
		return Info{}, errors.New("not a UKI: not a PE32+ image")
	}
	for _, s := range []string{".osrel", ".cmdline", ".linux", ".initrd"} {
		if f.Section(s) == nil {
			return Info{}, fmt.Errorf("not a UKI: no %s section", s)
		}
	}
	osrel, err := f.Section(".osrel").Data()
	if err != nil {
		return Info{}, fmt.Errorf("not a UKI: .osrel: %w", err)
	}
	// A section's data is padded to the file alignment with zeros.
	fields := parseOSRelease(bytes.TrimRight(osrel, "\x00"))
	info := Info{Version: fields["IMAGE_VERSION"], ID: fields["ID"]}
	if info.Version == "" {
		info.Version = fields["VERSION_ID"]
	}
	if info.ID != "cairn" {
		return Info{}, fmt.Errorf("not a Cairn UKI: its .osrel has ID=%q, want cairn", info.ID)
	}
	if err := CheckVersion(info.Version); err != nil {
		return Info{}, fmt.Errorf("UKI's .osrel: %w", err)
	}
	return info, nil
}

// parseOSRelease reads KEY=VALUE lines, the value unquoted.
func parseOSRelease(b []byte) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		} else {
			v = strings.Trim(v, `'"`)
		}
		m[k] = v
	}
	return m
}

// Compare orders versions as systemd-boot does (the UAPI version format,
// systemd's strverscmp_improved): -1 if a is older than b, 0 if equal, 1
// if newer. systemd-boot boots the newest of the entries not Bad.
func Compare(a, b string) int {
	const valid = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789~^.-"
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	isLetter := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	at := func(s string) byte {
		if s == "" {
			return 0
		}
		return s[0]
	}
	cmpBool := func(x, y bool) int { // false sorts first
		switch {
		case x == y:
			return 0
		case !x:
			return -1
		}
		return 1
	}
	span := func(s string, f func(byte) bool) int {
		i := 0
		for i < len(s) && f(s[i]) {
			i++
		}
		return i
	}
	for {
		// Drop what is not a version character.
		a = a[span(a, func(c byte) bool { return !strings.ContainsRune(valid, rune(c)) }):]
		b = b[span(b, func(c byte) bool { return !strings.ContainsRune(valid, rune(c)) }):]
		// '~' sorts before anything, the end included: 1~rc1 < 1.
		if at(a) == '~' || at(b) == '~' {
			if r := cmpBool(at(a) != '~', at(b) != '~'); r != 0 {
				return r
			}
			a, b = a[1:], b[1:]
		}
		// At an end, the longer is newer.
		if a == "" || b == "" {
			return cmpBool(a != "", b != "")
		}
		// '-', '^' and '.' separate: the one that has it where the other
		// has more of the segment is older.
		for _, sep := range []byte{'-', '^', '.'} {
			if at(a) == sep || at(b) == sep {
				if r := cmpBool(at(a) != sep, at(b) != sep); r != 0 {
					return r
				}
				a, b = a[1:], b[1:]
			}
		}
		var na, nb int
		if isDigit(at(a)) || isDigit(at(b)) {
			// Numbers: a missing one is older; leading zeros do not count.
			na, nb = span(a, isDigit), span(b, isDigit)
			za, zb := span(a[:na], func(c byte) bool { return c == '0' }), span(b[:nb], func(c byte) bool { return c == '0' })
			da, db := a[za:na], b[zb:nb]
			if r := cmpInt(len(da), len(db)); r != 0 {
				return r
			}
			if r := strings.Compare(da, db); r != 0 {
				return r
			}
		} else {
			na, nb = span(a, isLetter), span(b, isLetter)
			if r := strings.Compare(a[:min(na, nb)], b[:min(na, nb)]); r != 0 {
				return r
			}
			if r := cmpInt(na, nb); r != 0 {
				return r
			}
		}
		a, b = a[na:], b[nb:]
	}
}

func cmpInt(x, y int) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}
