package image

import (
	"bytes"
	"context"
	"debug/pe"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWriteUKI(t *testing.T) {
	needFile(t, stubPath, "systemd-boot-efi")
	dir := t.TempDir()
	u := UKI{
		Stub:      stubPath,
		OSRelease: []byte("ID=cairn\nVERSION_ID=0.1.0\n"),
		Cmdline:   []byte("console=ttyS0"),
		Linux:     writeFile(t, dir, "vmlinuz", randomBytes(3000, 1)),
		Initrd:    writeFile(t, dir, "initrd", randomBytes(70000, 2)),
	}
	out := filepath.Join(dir, "uki.efi")
	if err := WriteUKI(out, u); err != nil {
		t.Fatal(err)
	}

	stub, err := pe.Open(stubPath)
	if err != nil {
		t.Fatal(err)
	}
	defer stub.Close()
	got, err := pe.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	n := len(stub.Sections)
	if len(got.Sections) != n+4 {
		t.Fatalf("UKI has %d sections, want %d", len(got.Sections), n+4)
	}
	for i, s := range stub.Sections {
		if diff := cmp.Diff(s.SectionHeader, got.Sections[i].SectionHeader); diff != "" {
			t.Errorf("stub section %s changed (-stub +uki):\n%s", s.Name, diff)
		}
		if !bytes.Equal(sectionData(t, s), sectionData(t, got.Sections[i])) {
			t.Errorf("stub section %s: contents changed", s.Name)
		}
	}

	oh := got.OptionalHeader.(*pe.OptionalHeader64)
	linux, _ := os.ReadFile(u.Linux)
	initrd, _ := os.ReadFile(u.Initrd)
	prev := got.Sections[n-1]
	for i, want := range []section{{".osrel", u.OSRelease}, {".cmdline", u.Cmdline}, {".linux", linux}, {".initrd", initrd}} {
		s := got.Sections[n+i]
		if s.Name != want.name {
			t.Errorf("section %d is %s, want %s", n+i, s.Name, want.name)
		}
		if data := sectionData(t, s); !bytes.Equal(data[:s.VirtualSize], want.data) {
			t.Errorf("section %s: contents differ from input", want.name)
		}
		if s.Characteristics != 0x40000040 {
			t.Errorf("section %s: characteristics %#x, want 0x40000040", s.Name, s.Characteristics)
		}
		if s.VirtualAddress%oh.SectionAlignment != 0 || s.VirtualAddress < prev.VirtualAddress+prev.VirtualSize {
			t.Errorf("section %s at %#x: not aligned or overlaps %s", s.Name, s.VirtualAddress, prev.Name)
		}
		if s.Offset%oh.FileAlignment != 0 {
			t.Errorf("section %s: file offset %#x not aligned", s.Name, s.Offset)
		}
		prev = s
	}
	if want := alignUp(prev.VirtualAddress+prev.VirtualSize, oh.SectionAlignment); oh.SizeOfImage != want {
		t.Errorf("SizeOfImage %#x, want %#x", oh.SizeOfImage, want)
	}
	if oh.CheckSum != 0 {
		t.Errorf("CheckSum %#x, want 0", oh.CheckSum)
	}

	again := filepath.Join(dir, "again.efi")
	if err := WriteUKI(again, u); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, out), readFile(t, again)) {
		t.Error("two UKIs from the same inputs differ")
	}

	t.Run("objdump", func(t *testing.T) {
		needTools(t, objdump)
		headers, _, err := objdump.run(context.Background(), nil, "-h", out)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{".text", ".sdmagic", ".osrel", ".cmdline", ".linux", ".initrd"} {
			if !strings.Contains(string(headers), " "+name+" ") {
				t.Errorf("objdump -h does not list %s:\n%s", name, headers)
			}
		}
	})
}

func TestAppendSectionsErrors(t *testing.T) {
	needFile(t, stubPath, "systemd-boot-efi")
	stub := readFile(t, stubPath)
	f, err := pe.NewFile(bytes.NewReader(stub))
	if err != nil {
		t.Fatal(err)
	}
	peOff := int(binary.LittleEndian.Uint32(stub[0x3c:]))
	optOff := peOff + peSignatureSize + coffHeaderSize
	tableEnd := optOff + int(f.SizeOfOptionalHeader) + sectionHeaderSize*len(f.Sections)
	four := []section{{".osrel", []byte("a")}, {".cmdline", []byte("b")}, {".linux", []byte("c")}, {".initrd", []byte("d")}}
	patched := func(off int, v uint32) []byte {
		b := bytes.Clone(stub)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}

	tests := []struct {
		name string
		stub []byte
		secs []section
		want string
	}{
		{"not PE", []byte("MZ not really"), four, "parsing PE image"},
		{"headers too small", patched(optOff+60, uint32(tableEnd+sectionHeaderSize)), four, "no room for 4 more section headers"},
		{"signed", patched(optOff+112+8*pe.IMAGE_DIRECTORY_ENTRY_SECURITY+4, 0x100), four, "image is signed"},
		{"empty section", stub, []section{{".cmdline", nil}}, "section .cmdline is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := appendSections(tt.stub, tt.secs)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("appendSections() error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// sectionData returns the file contents of s.
func sectionData(t *testing.T, s *pe.Section) []byte {
	t.Helper()
	b, err := s.Data()
	if err != nil {
		t.Fatalf("section %s: %v", s.Name, err)
	}
	return b
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
