package bootentry

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-os/cairn/image"
)

// TestCompare: the order of systemd's own tests of strverscmp_improved,
// each version newer than the one before.
func TestCompare(t *testing.T) {
	ordered := []string{"~1", "", "ab", "abb", "abc", "0001", "002", "12", "122", "122.9",
		"123~rc1", "123", "123-a", "123-a.1", "123-a1", "123-a1.1", "123-3", "123-3.1",
		"123^patch1", "123^1", "123.a-1", "123.1-1", "123a-1", "124"}
	for i, a := range ordered {
		for j, b := range ordered {
			want := cmpInt(i, j)
			if got := Compare(a, b); got != want {
				t.Errorf("Compare(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"0.1.0", "0.1.0", 0}, {"0.1.0", "0.1.1", -1}, {"0.10.0", "0.9.9", 1},
		{"0.1.0", "0.1.0-e2e", -1}, {"0.1.0.1", "0.1.0", 1}, {"1.0", "1.00", 0},
	} {
		if got := Compare(c.a, c.b); got != c.want {
			t.Errorf("Compare(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestParse(t *testing.T) {
	for _, c := range []struct {
		name string
		want Entry
		ok   bool
	}{
		{"cairn-0.1.0.efi", Entry{Version: "0.1.0"}, true},
		{"cairn-0.2.0+3.efi", Entry{Version: "0.2.0", Counting: true, Left: 3}, true},
		{"cairn-0.2.0+2-1.efi", Entry{Version: "0.2.0", Counting: true, Left: 2, Done: 1}, true},
		{"cairn-0.2.0+0-3.efi", Entry{Version: "0.2.0", Counting: true, Left: 0, Done: 3}, true},
		{"cairn-0.2.0-rc1+1.efi", Entry{Version: "0.2.0-rc1", Counting: true, Left: 1}, true},
		{"cairn-.efi", Entry{}, false},
		{"linux.efi", Entry{}, false},
		{"cairn-0.1.0.efi.tmp", Entry{}, false},
		{"cairn-0.1+x.efi", Entry{}, false},
	} {
		got, ok := Parse(c.name)
		if got != c.want || ok != c.ok {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
		if ok && got.Name() != c.name {
			t.Errorf("Parse(%q).Name() = %q", c.name, got.Name())
		}
	}
	e := New("0.2.0", 3)
	if e.Name() != "cairn-0.2.0+3.efi" || e.Bad() || e.Blessed().Name() != "cairn-0.2.0.efi" {
		t.Errorf("New(0.2.0, 3): %q bad=%v blessed %q", e.Name(), e.Bad(), e.Blessed().Name())
	}
	if bad, _ := Parse("cairn-0.2.0+0-3.efi"); !bad.Bad() {
		t.Error("+0-3 not Bad")
	}
}

// TestReadUKI reads back a UKI written by the image builder from the
// systemd stub, and refuses what is not a Cairn UKI.
func TestReadUKI(t *testing.T) {
	const stub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub" // hack/deps.sh installs it
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kernel, initrd := write("vmlinuz", "kernel"), write("initrd", "initrd")
	uki := func(osrel string) []byte {
		out := filepath.Join(dir, "uki.efi")
		if err := image.WriteUKI(out, image.UKI{Stub: stub, OSRelease: []byte(osrel), Cmdline: []byte("quiet"), Linux: kernel, Initrd: initrd}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	info, err := ReadUKI(bytes.NewReader(uki("NAME=\"Cairn\"\nID=cairn\nVERSION_ID=0.1.0\nIMAGE_VERSION=0.2.0-rc1\n")))
	if err != nil || info.Version != "0.2.0-rc1" {
		t.Errorf("ReadUKI = %+v, %v; want version 0.2.0-rc1", info, err)
	}
	for _, c := range []struct {
		data []byte
		want string
	}{
		{uki("ID=debian\nVERSION_ID=12\n"), `ID="debian"`},
		{uki("ID=cairn\nVERSION_ID=1+2\n"), `version "1+2"`},
		{[]byte("MZ not an image at all"), "not a PE image"},
	} {
		if _, err := ReadUKI(bytes.NewReader(c.data)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ReadUKI(%.20q) = %v, want an error with %q", c.data, err, c.want)
		}
	}
	stubBytes, err := os.ReadFile(stub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadUKI(bytes.NewReader(stubBytes)); err == nil || !strings.Contains(err.Error(), "no .osrel section") {
		t.Errorf("ReadUKI(the stub alone) = %v, want no .osrel section", err)
	}
}
