package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Format is a disk image format that a raw disk can be converted to.
type Format interface {
	// Name is the format's name, as given to FormatByName.
	Name() string
	// Ext is the file name extension of its images, with the dot.
	Ext() string
	// Sparse says whether its image is as large as the disk, with holes
	// for what is zero: its manifest entry is then a blocks digest.
	Sparse() bool
	// Convert writes the raw disk image raw to out in this format. It
	// leaves raw in place.
	Convert(ctx context.Context, raw, out string) error
}

// formats are the known formats, sorted by name.
var formats = []Format{gcpFormat{}, isoFormat{}, qcow2Format{}, rawFormat{}, vhdFormat{}, vmdkFormat{}}

// Formats returns the names of the known formats, sorted.
func Formats() []string {
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = f.Name()
	}
	return names
}

// FormatByName returns the format called name.
func FormatByName(name string) (Format, error) {
	for _, f := range formats {
		if f.Name() == name {
			return f, nil
		}
	}
	return nil, fmt.Errorf("unknown image format %q: valid formats are %s", name, strings.Join(Formats(), ", "))
}

// rawFormat is the raw disk itself, copied sparsely.
type rawFormat struct{}

func (rawFormat) Name() string { return "raw" }
func (rawFormat) Ext() string  { return ".raw" }
func (rawFormat) Sparse() bool { return true }

func (rawFormat) Convert(ctx context.Context, raw, out string) error {
	st, err := os.Stat(raw)
	if err != nil {
		return fmt.Errorf("raw disk: %w", err)
	}
	if err := createSparse(out, st.Size()); err != nil {
		return err
	}
	f, err := os.OpenFile(out, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", out, err)
	}
	defer f.Close()
	if err := copyNonZero(ctx, f, raw, 0); err != nil {
		return fmt.Errorf("copying raw disk: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", out, err)
	}
	return nil
}

// qcow2Format is QEMU's copy-on-write format, made by qemu-img.
type qcow2Format struct{}

func (qcow2Format) Name() string { return "qcow2" }
func (qcow2Format) Ext() string  { return ".qcow2" }
func (qcow2Format) Sparse() bool { return false }

func (qcow2Format) Convert(ctx context.Context, raw, out string) error {
	return qemuConvert(ctx, raw, out, "qcow2", nil, nil)
}

// qemuConvert converts raw to out with qemu-img, to format with the
// options opts; then, if fix is set, has it rewrite in out what qemu-img
// made random, from the disk's id (diskID).
func qemuConvert(ctx context.Context, raw, out, format string, opts []string, fix func(f *os.File, id [32]byte) error) error {
	args := append(append([]string{"convert", "-f", "raw", "-O", format}, opts...), raw, out)
	if _, _, err := qemuImg.run(ctx, nil, args...); err != nil {
		return err
	}
	if fix == nil {
		return nil
	}
	id, err := diskID(raw)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(out, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := fix(f, id); err != nil {
		return err
	}
	return f.Close()
}

// diskID identifies the raw disk for the formats that put an ID of
// their own in their headers (qemu-img makes it random): the GPT disk
// GUID, which the build derives from its inputs, so that one disk always
// converts to the same bytes. A disk without a GPT has the zero ID.
func diskID(raw string) ([32]byte, error) {
	f, err := os.Open(raw)
	if err != nil {
		return [32]byte{}, fmt.Errorf("raw disk: %w", err)
	}
	defer f.Close()
	guid := make([]byte, 16)
	// LBA 1 is the GPT header; the disk GUID is at byte 56 of it.
	if _, err := f.ReadAt(guid, 512+56); err != nil && !errors.Is(err, io.EOF) {
		return [32]byte{}, fmt.Errorf("raw disk: %w", err)
	}
	return sha256.Sum256(guid), nil
}

// vhdFormat is a fixed VHD (qemu-img's vpc), the disk Azure takes: the
// raw disk, its size kept exact, and a 512-byte footer whose creation
// time is zeroed and whose UUID comes from the disk (diskID).
type vhdFormat struct{}

func (vhdFormat) Name() string { return "vhd" }
func (vhdFormat) Ext() string  { return ".vhd" }
func (vhdFormat) Sparse() bool { return true }

func (vhdFormat) Convert(ctx context.Context, raw, out string) error {
	st, err := os.Stat(raw)
	if err != nil {
		return fmt.Errorf("raw disk: %w", err)
	}
	if st.Size()%(1<<20) != 0 {
		return fmt.Errorf("vhd: the disk is %d bytes, not a whole number of MiB as Azure needs: build it with a --size in MiB", st.Size())
	}
	return qemuConvert(ctx, raw, out, "vpc", []string{"-o", "subformat=fixed,force_size=on"}, func(f *os.File, id [32]byte) error {
		return fixVHDFooter(f, st.Size(), id)
	})
}

// fixVHDFooter zeroes the time stamp of the footer of the fixed VHD f of
// a disk of size bytes, sets its unique id to id's first bytes, and sums
// it again.
func fixVHDFooter(f *os.File, size int64, id [32]byte) error {
	footer := make([]byte, 512)
	at := size // a fixed VHD is the disk, then its footer
	if _, err := f.ReadAt(footer, at); err != nil {
		return fmt.Errorf("vhd footer: %w", err)
	}
	if string(footer[:8]) != "conectix" {
		return fmt.Errorf("vhd footer: no conectix cookie at %d", at)
	}
	clear(footer[24:28])       // time stamp
	copy(footer[68:84], id[:]) // unique id
	clear(footer[64:68])
	var sum uint32
	for _, b := range footer {
		sum += uint32(b)
	}
	binary.BigEndian.PutUint32(footer[64:68], ^sum)
	if _, err := f.WriteAt(footer, at); err != nil {
		return fmt.Errorf("vhd footer: %w", err)
	}
	return nil
}

// vmdkFormat is a streamOptimized VMDK, which VMware and AWS import: its
// embedded descriptor's random CID is replaced by one from the disk
// (diskID), its extent named disk.vmdk whatever the file's name.
type vmdkFormat struct{}

func (vmdkFormat) Name() string { return "vmdk" }
func (vmdkFormat) Ext() string  { return ".vmdk" }
func (vmdkFormat) Sparse() bool { return false }

func (vmdkFormat) Convert(ctx context.Context, raw, out string) error {
	return qemuConvert(ctx, raw, out, "vmdk", []string{"-o", "subformat=streamOptimized"}, fixVMDKDescriptor)
}

// fixVMDKDescriptor sets the CID of the descriptor of the
// streamOptimized VMDK f from id, and names its extent disk.vmdk.
func fixVMDKDescriptor(f *os.File, id [32]byte) error {
	// The sparse extent header: magic, then (at 28 and 36) where the
	// descriptor is and its size, in sectors.
	header := make([]byte, 64)
	if _, err := f.ReadAt(header, 0); err != nil {
		return fmt.Errorf("vmdk header: %w", err)
	}
	if string(header[:4]) != "KDMV" {
		return errors.New("vmdk header: no KDMV magic")
	}
	offset, size := int64(binary.LittleEndian.Uint64(header[28:]))*512, int64(binary.LittleEndian.Uint64(header[36:]))*512
	if size == 0 || size > 1<<20 {
		return fmt.Errorf("vmdk header: a descriptor of %d bytes", size)
	}
	region := make([]byte, size)
	if _, err := f.ReadAt(region, offset); err != nil {
		return fmt.Errorf("vmdk descriptor: %w", err)
	}
	text, _, _ := bytes.Cut(region, []byte{0})
	lines := strings.Split(string(text), "\n")
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "CID="):
			lines[i] = fmt.Sprintf("CID=%08x", binary.BigEndian.Uint32(id[:4]))
		case strings.HasPrefix(l, "RW ") && strings.Contains(l, `"`):
			lines[i] = l[:strings.Index(l, `"`)] + `"disk.vmdk"`
		}
	}
	fixed := []byte(strings.Join(lines, "\n"))
	if len(fixed) > len(region) {
		return errors.New("vmdk descriptor: no room for the new CID")
	}
	clear(region)
	copy(region, fixed)
	if _, err := f.WriteAt(region, offset); err != nil {
		return fmt.Errorf("vmdk descriptor: %w", err)
	}
	return nil
}

// gcpFormat is the archive Google Compute Engine imports: the raw disk as
// disk.raw, sparse, in a gzipped tar of GNU's oldgnu format, written by
// GNU tar and gzip with every stamp fixed (owner, mode, time, name).
type gcpFormat struct{}

func (gcpFormat) Name() string { return "gcp" }
func (gcpFormat) Ext() string  { return ".tar.gz" }
func (gcpFormat) Sparse() bool { return false }

func (gcpFormat) Convert(ctx context.Context, raw, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".gcp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Symlink(raw, filepath.Join(dir, "disk.raw")); err != nil {
		return err
	}
	tarball := filepath.Join(dir, "disk.tar")
	if _, _, err := gnuTar.run(ctx, nil, "--format=oldgnu", "--sparse", "--dereference", "--mtime=@0",
		"--owner=0", "--group=0", "--numeric-owner", "--mode=0644", "-C", dir, "-cf", tarball, "disk.raw"); err != nil {
		return err
	}
	if _, _, err := gzipTool.run(ctx, nil, "-n", "-6", tarball); err != nil {
		return err
	}
	return os.Rename(tarball+".gz", out)
}
