package stage2

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf16"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/image"
)

// The firmware's boot entries are EFI global variables: Boot#### (an
// EFI_LOAD_OPTION each) and BootOrder, the order the firmware tries them.
const (
	efiGlobal = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
	// efiVarAttrs: non-volatile, boot service and runtime access.
	efiVarAttrs = 0x7
	// bootEntryName is the entry's description, what firmware menus show.
	bootEntryName = "Cairn"
	// bootLoaderPath is systemd-boot on the ESP, at the default path.
	bootLoaderPath = `\EFI\BOOT\BOOTX64.EFI`
)

// loadOption encodes the EFI_LOAD_OPTION of an active entry that starts
// bootLoaderPath on the GPT partition esp: attributes, the device path's
// length, the description (UTF-16, NUL-terminated), then the device
// path: a hard drive node, a file path node and the end node.
func loadOption(esp image.Partition) ([]byte, error) {
	guid, err := uuid.Parse(esp.GUID)
	if err != nil {
		return nil, fmt.Errorf("ESP partition GUID %q: %w", esp.GUID, err)
	}
	// The GPT stores a GUID with its first three fields little-endian.
	sig := guid[:]
	sig = []byte{sig[3], sig[2], sig[1], sig[0], sig[5], sig[4], sig[7], sig[6], sig[8], sig[9], sig[10], sig[11], sig[12], sig[13], sig[14], sig[15]}
	var path []byte
	path = append(path, 4, 1) // media, hard drive
	path = binary.LittleEndian.AppendUint16(path, 42)
	path = binary.LittleEndian.AppendUint32(path, uint32(esp.Number))
	path = binary.LittleEndian.AppendUint64(path, esp.Start)
	path = binary.LittleEndian.AppendUint64(path, esp.Sectors)
	path = append(path, sig...)
	path = append(path, 2, 2) // GPT, GUID signature
	file := utf16z(bootLoaderPath)
	path = append(path, 4, 4) // media, file path
	path = binary.LittleEndian.AppendUint16(path, uint16(4+len(file)))
	path = append(path, file...)
	path = append(path, 0x7f, 0xff, 4, 0) // end of the device path

	opt := binary.LittleEndian.AppendUint32(nil, 1) // LOAD_OPTION_ACTIVE
	opt = binary.LittleEndian.AppendUint16(opt, uint16(len(path)))
	opt = append(opt, utf16z(bootEntryName)...)
	return append(opt, path...), nil
}

// utf16z is s in UTF-16LE with a NUL at its end.
func utf16z(s string) []byte {
	var b []byte
	for _, c := range utf16.Encode([]rune(s)) {
		b = binary.LittleEndian.AppendUint16(b, c)
	}
	return append(b, 0, 0)
}

// addBootEntry makes the firmware boot the installed disk's ESP first:
// it writes a Boot#### variable for it in dir (efivarfs), reusing the
// number of an entry of the same content, and puts it first in
// BootOrder. It returns the entry's name.
func addBootEntry(dir string, esp image.Partition) (string, error) {
	opt, err := loadOption(esp)
	if err != nil {
		return "", err
	}
	data := append(binary.LittleEndian.AppendUint32(nil, efiVarAttrs), opt...)
	used := map[uint16]bool{}
	num, found := uint16(0), false
	vars, _ := filepath.Glob(filepath.Join(dir, "Boot[0-9A-F][0-9A-F][0-9A-F][0-9A-F]-"+efiGlobal))
	for _, v := range vars {
		var n uint16
		if _, err := fmt.Sscanf(filepath.Base(v), "Boot%04X-", &n); err != nil {
			continue
		}
		used[n] = true
		if b, err := os.ReadFile(v); err == nil && slices.Equal(b[4:], opt) && !found {
			num, found = n, true
		}
	}
	for ; !found && used[num]; num++ {
	}
	name := fmt.Sprintf("Boot%04X", num)
	if !found {
		if err := writeEFIVar(filepath.Join(dir, name+"-"+efiGlobal), data); err != nil {
			return "", err
		}
	}
	order := []uint16{num}
	if b, err := os.ReadFile(filepath.Join(dir, "BootOrder-"+efiGlobal)); err == nil && len(b) >= 4 {
		for i := 4; i+1 < len(b); i += 2 {
			if n := binary.LittleEndian.Uint16(b[i:]); n != num {
				order = append(order, n)
			}
		}
	}
	b := binary.LittleEndian.AppendUint32(nil, efiVarAttrs)
	for _, n := range order {
		b = binary.LittleEndian.AppendUint16(b, n)
	}
	if err := writeEFIVar(filepath.Join(dir, "BootOrder-"+efiGlobal), b); err != nil {
		return name, err
	}
	return name, nil
}

// fsImmutable is FS_IMMUTABLE_FL of the inode flags (linux/fs.h).
const fsImmutable = 0x10

// writeEFIVar writes an efivarfs file in one write, as efivarfs takes a
// variable: its attributes, then its value. efivarfs makes existing
// variables immutable; that flag is cleared first.
func writeEFIVar(path string, data []byte) error {
	if f, err := os.Open(path); err == nil {
		flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
		if err == nil && flags&fsImmutable != 0 {
			err = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags&^fsImmutable))
		}
		f.Close()
		if err != nil && !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("%s: clear immutable: %w", filepath.Base(path), err)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("write the firmware variable %s: %w", strings.TrimSuffix(filepath.Base(path), "-"+efiGlobal), err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write the firmware variable %s: %w", strings.TrimSuffix(filepath.Base(path), "-"+efiGlobal), err)
	}
	return f.Close()
}
