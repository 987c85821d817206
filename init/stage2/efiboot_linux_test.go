package stage2

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/cairn-os/cairn/image"
)

// readBootOrder reads BootOrder in dir.
func readBootOrder(t *testing.T, dir string) []uint16 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "BootOrder-"+efiGlobal))
	if err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint32(b) != efiVarAttrs {
		t.Errorf("BootOrder attributes %#x, want %#x", binary.LittleEndian.Uint32(b), efiVarAttrs)
	}
	var order []uint16
	for i := 4; i+1 < len(b); i += 2 {
		order = append(order, binary.LittleEndian.Uint16(b[i:]))
	}
	return order
}

// TestAddBootEntry writes the installed disk's boot entry into a
// directory laid out as efivarfs: a new number beside the firmware's
// entries, first in BootOrder; the same entry again reuses its number.
func TestAddBootEntry(t *testing.T) {
	dir := t.TempDir()
	esp := image.Partition{Number: 1, Start: 2048, Sectors: 524288, GUID: "0b5d7a3e-1c2f-4d6e-8a9b-0c1d2e3f4a5b"}
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name+"-"+efiGlobal), append([]byte{7, 0, 0, 0}, data...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Boot0000", []byte("the firmware's shell"))
	write("Boot0001", []byte("the firmware's network boot"))
	write("BootOrder", []byte{1, 0, 0, 0})

	for range 2 {
		name, err := addBootEntry(dir, esp)
		if err != nil || name != "Boot0002" {
			t.Fatalf("addBootEntry = %q, %v; want Boot0002", name, err)
		}
		if got := readBootOrder(t, dir); !slices.Equal(got, []uint16{2, 1, 0}) {
			t.Errorf("BootOrder = %v, want [2 1 0]", got)
		}
	}

	b, err := os.ReadFile(filepath.Join(dir, "Boot0002-"+efiGlobal))
	if err != nil {
		t.Fatal(err)
	}
	opt := b[4:]
	if attrs := binary.LittleEndian.Uint32(opt); attrs != 1 {
		t.Errorf("load option attributes %d, want 1 (active)", attrs)
	}
	pathLen := int(binary.LittleEndian.Uint16(opt[4:]))
	desc := opt[6 : 6+len(bootEntryName)*2+2]
	if got := string(utf16.Decode(u16s(desc[:len(desc)-2]))); got != bootEntryName {
		t.Errorf("description %q, want %q", got, bootEntryName)
	}
	path := opt[6+len(desc):]
	if len(path) != pathLen {
		t.Fatalf("device path of %d bytes, the option says %d", len(path), pathLen)
	}
	// Hard drive node: partition 1 at 2048 of 524288 sectors, the GUID
	// mixed-endian, GPT.
	hd := path[:42]
	if hd[0] != 4 || hd[1] != 1 || binary.LittleEndian.Uint32(hd[4:]) != 1 || binary.LittleEndian.Uint64(hd[8:]) != 2048 ||
		binary.LittleEndian.Uint64(hd[16:]) != 524288 || hd[40] != 2 || hd[41] != 2 {
		t.Errorf("hard drive node % x", hd)
	}
	if got, want := hd[24:40], []byte{0x3e, 0x7a, 0x5d, 0x0b, 0x2f, 0x1c, 0x6e, 0x4d, 0x8a, 0x9b, 0x0c, 0x1d, 0x2e, 0x3f, 0x4a, 0x5b}; !slices.Equal(got, want) {
		t.Errorf("partition signature % x, want % x", got, want)
	}
	file := path[42:]
	if file[0] != 4 || file[1] != 4 {
		t.Fatalf("file path node % x", file[:4])
	}
	n := int(binary.LittleEndian.Uint16(file[2:]))
	if got := string(utf16.Decode(u16s(file[4 : n-2]))); got != bootLoaderPath {
		t.Errorf("file path %q, want %q", got, bootLoaderPath)
	}
	if end := file[n:]; !slices.Equal(end, []byte{0x7f, 0xff, 4, 0}) {
		t.Errorf("end node % x", end)
	}
	if strings.Count(strings.Join(names(t, dir), " "), "Boot000") != 3 {
		t.Errorf("efivars holds %v, want three entries", names(t, dir))
	}
}

func u16s(b []byte) []uint16 {
	var u []uint16
	for i := 0; i+1 < len(b); i += 2 {
		u = append(u, binary.LittleEndian.Uint16(b[i:]))
	}
	return u
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, d := range des {
		n = append(n, d.Name())
	}
	return n
}
