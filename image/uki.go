package image

import (
	"bytes"
	"debug/pe"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
)

// UKI describes a unified kernel image: the systemd EFI stub with the OS
// release, kernel command line, kernel and initrd embedded as PE sections.
type UKI struct {
	Stub      string // path to the systemd stub, e.g. linuxx64.efi.stub
	OSRelease []byte // contents of the .osrel section (an os-release file)
	Cmdline   []byte // contents of the .cmdline section
	Linux     string // path to the kernel image
	Initrd    string // path to the initrd
}

// ukiSectionFlags marks the added sections as initialized, read-only data.
const ukiSectionFlags = pe.IMAGE_SCN_CNT_INITIALIZED_DATA | pe.IMAGE_SCN_MEM_READ

// Sizes and offsets in the PE headers, from the PE/COFF specification.
const (
	peSignatureSize     = 4
	coffHeaderSize      = 20
	sectionHeaderSize   = 40
	offNumberOfSections = peSignatureSize + 2 // from the PE signature
	offSizeOfInitData   = 8                   // from the optional header
	offSizeOfImage      = 56                  // from the optional header
	offCheckSum         = 64                  // from the optional header
)

// section is a named PE section to add to a stub.
type section struct {
	name string
	data []byte
}

// WriteUKI writes the UKI described by u to out. The output is the stub with
// the sections .osrel, .cmdline, .linux and .initrd appended in that order;
// the same inputs always give the same bytes.
func WriteUKI(out string, u UKI) error {
	stub, err := os.ReadFile(u.Stub)
	if err != nil {
		return fmt.Errorf("reading UKI stub: %w", err)
	}
	linux, err := os.ReadFile(u.Linux)
	if err != nil {
		return fmt.Errorf("reading kernel: %w", err)
	}
	initrd, err := os.ReadFile(u.Initrd)
	if err != nil {
		return fmt.Errorf("reading initrd: %w", err)
	}
	img, err := appendSections(stub, []section{
		{".osrel", u.OSRelease},
		{".cmdline", u.Cmdline},
		{".linux", linux},
		{".initrd", initrd},
	})
	if err != nil {
		return fmt.Errorf("stub %s: %w", u.Stub, err)
	}
	if err := os.WriteFile(out, img, 0o644); err != nil {
		return fmt.Errorf("writing UKI: %w", err)
	}
	return nil
}

// appendSections returns a copy of the PE32+ image stub with secs added
// after its last section, both in memory and in the file, and the header
// fields that depend on them updated. The checksum is set to 0, which UEFI
// firmware does not check.
func appendSections(stub []byte, secs []section) ([]byte, error) {
	f, err := pe.NewFile(bytes.NewReader(stub))
	if err != nil {
		return nil, fmt.Errorf("parsing PE image: %w", err)
	}
	oh, ok := f.OptionalHeader.(*pe.OptionalHeader64)
	if !ok {
		return nil, errors.New("not a PE32+ image")
	}
	if oh.DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY].Size != 0 {
		return nil, errors.New("image is signed and adding sections would break the signature: use an unsigned stub")
	}
	if len(f.Sections) == 0 {
		return nil, errors.New("image has no sections")
	}

	// The new section headers go right after the existing ones, in space
	// that must be free: before the end of the headers and before the first
	// section's data.
	peOff := int(binary.LittleEndian.Uint32(stub[0x3c:]))
	optOff := peOff + peSignatureSize + coffHeaderSize
	tableEnd := optOff + int(f.SizeOfOptionalHeader) + sectionHeaderSize*len(f.Sections)
	limit := int(oh.SizeOfHeaders)
	var end uint32 // end of the last section in memory
	for _, s := range f.Sections {
		if s.Size > 0 && int(s.Offset) < limit {
			limit = int(s.Offset)
		}
		end = max(end, s.VirtualAddress+max(s.VirtualSize, s.Size))
	}
	need := sectionHeaderSize * len(secs)
	if tableEnd+need > min(limit, len(stub)) || !bytes.Equal(stub[tableEnd:tableEnd+need], make([]byte, need)) {
		return nil, fmt.Errorf("no room for %d more section headers: the section table ends at %#x and free space at %#x",
			len(secs), tableEnd, limit)
	}

	img := bytes.Clone(stub)
	img = append(img, make([]byte, padding(len(img), oh.FileAlignment))...)
	va := alignUp(end, oh.SectionAlignment)
	initData := binary.LittleEndian.Uint32(img[optOff+offSizeOfInitData:])
	for i, s := range secs {
		if len(s.data) == 0 {
			return nil, fmt.Errorf("section %s is empty", s.name)
		}
		h := pe.SectionHeader32{
			VirtualSize:      uint32(len(s.data)),
			VirtualAddress:   va,
			SizeOfRawData:    alignUp(uint32(len(s.data)), oh.FileAlignment),
			PointerToRawData: uint32(len(img)),
			Characteristics:  ukiSectionFlags,
		}
		copy(h.Name[:], s.name)
		if _, err := binary.Encode(img[tableEnd+i*sectionHeaderSize:], binary.LittleEndian, h); err != nil {
			return nil, fmt.Errorf("encoding section header %s: %w", s.name, err)
		}
		img = append(img, s.data...)
		img = append(img, make([]byte, padding(len(img), oh.FileAlignment))...)
		va = alignUp(va+h.VirtualSize, oh.SectionAlignment)
		initData += h.SizeOfRawData
	}

	le := binary.LittleEndian
	le.PutUint16(img[peOff+offNumberOfSections:], uint16(len(f.Sections)+len(secs)))
	le.PutUint32(img[optOff+offSizeOfInitData:], initData)
	le.PutUint32(img[optOff+offSizeOfImage:], va)
	le.PutUint32(img[optOff+offCheckSum:], 0)
	return img, nil
}

// alignUp rounds n up to a multiple of align.
func alignUp(n, align uint32) uint32 {
	return (n + align - 1) / align * align
}

// padding returns how many bytes make n a multiple of align.
func padding(n int, align uint32) int {
	return int(alignUp(uint32(n), align)) - n
}
