package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/ext4"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/klauspost/compress/zstd"
)

// MinInstallSize is the smallest disk a Cairn disk can be installed on:
// its partitions, the backup GPT, and the least EPHEMERAL worth making.
const MinInstallSize = minSize + 64*mib

// ErrNotMedium is OpenMedium's error for a device that is not an
// install medium.
var ErrNotMedium = errors.New("not a Cairn install medium")

// Medium is an install medium, read with go-diskfs's ISO 9660 reader:
// nothing is mounted, and no kernel module is needed.
type Medium struct {
	f    *os.File
	fsys *iso9660.FileSystem
}

// OpenMedium opens the device or file at path as an install medium.
func OpenMedium(path string) (*Medium, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	size, err := f.Seek(0, io.SeekEnd) // a block device's size too
	if err != nil {
		f.Close()
		return nil, err
	}
	// Block size 0: the reader finds the volume's 2 KiB blocks itself.
	fsys, err := iso9660.Read(file.New(f, true), size, 0, 0)
	if err != nil || strings.TrimSpace(fsys.Label()) != MediumLabel {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, ErrNotMedium)
	}
	return &Medium{f: f, fsys: fsys}, nil
}

// Open opens the medium's file at name, an absolute slash-separated path.
func (m *Medium) Open(name string) (io.ReadCloser, error) {
	return m.fsys.OpenFile(name, os.O_RDONLY)
}

// Close closes the medium's device.
func (m *Medium) Close() error { return m.f.Close() }

// Unpacked is a medium's disk, read into a scratch directory: its
// partition table and STATE, whose machine config says where to install.
type Unpacked struct {
	table *gpt.Table
	state string // STATE's image
}

// Unpack reads the partition table and STATE of m into files in dir.
func Unpack(m *Medium, dir string) (*Unpacked, error) {
	head, err := readMediumFile(m, mediumTable, dir, false)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(head)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	table, err := gpt.Read(f, sectorSize, sectorSize)
	if err != nil {
		return nil, fmt.Errorf("install medium: the disk's partition table: %w", err)
	}
	state, err := readMediumFile(m, mediumState, dir, true)
	if err != nil {
		return nil, err
	}
	return &Unpacked{table: table, state: state}, nil
}

// readMediumFile copies the medium's file name into dir, decompressing
// it if compressed, and returns the copy's path.
func readMediumFile(m *Medium, name, dir string, compressed bool) (string, error) {
	r, err := m.Open(name)
	if err != nil {
		return "", fmt.Errorf("install medium: %s: %w", name, err)
	}
	defer r.Close()
	src := r
	if compressed {
		zr, err := zstd.NewReader(r)
		if err != nil {
			return "", fmt.Errorf("install medium: %s: %w", name, err)
		}
		defer zr.Close()
		src = zr.IOReadCloser()
	}
	out := filepath.Join(dir, filepath.Base(name))
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := io.Copy(f, src); err != nil {
		return "", fmt.Errorf("install medium: %s: %w", name, err)
	}
	return out, f.Close()
}

// StateFile returns the content of the file name in the medium's
// STATE (e.g. "/config.yaml"), read with go-diskfs's ext4 reader.
func (u *Unpacked) StateFile(name string) ([]byte, error) {
	f, err := os.Open(u.state)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	fsys, err := ext4.Read(file.New(f, true), st.Size(), 0, sectorSize)
	if err != nil {
		return nil, fmt.Errorf("install medium: STATE: %w", err)
	}
	// go-diskfs's error for a missing file is not fs.ErrNotExist.
	dir := path.Dir(strings.TrimPrefix(name, "/")) // ReadDir takes fs.FS paths
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("install medium: STATE %s: %w", dir, err)
	}
	if !slices.ContainsFunc(entries, func(e fs.DirEntry) bool { return e.Name() == filepath.Base(name) }) {
		return nil, fmt.Errorf("install medium: STATE %s: %w", name, fs.ErrNotExist)
	}
	r, err := fsys.OpenFile(name, os.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("install medium: STATE %s: %w", name, err)
	}
	defer r.Close()
	return io.ReadAll(r)
}

// Install writes the medium's disk onto dev, a disk of size bytes: a
// partition table for that size with the image's partitions (the same
// GUIDs), then each partition's bytes, and syncs. The first boot from
// it makes EPHEMERAL in the rest of the disk, as on an image's.
func (u *Unpacked) Install(ctx context.Context, m *Medium, dev *os.File, size int64) error {
	if size < MinInstallSize {
		return fmt.Errorf("%d MiB, too small: a Cairn disk needs at least %d MiB", size/mib, MinInstallSize/mib)
	}
	table := FreshTable(u.table)
	if err := table.Write(dev, size); err != nil {
		return fmt.Errorf("writing the partition table: %w", err)
	}
	for _, p := range table.Partitions {
		var src io.ReadCloser
		var err error
		switch p.Name {
		case "EFI":
			src, err = m.Open(mediumESP)
		case "STATE":
			src, err = os.Open(u.state)
		default:
			return fmt.Errorf("install medium: a partition %q the installer does not know", p.Name)
		}
		if err != nil {
			return fmt.Errorf("install medium: partition %s: %w", p.Name, err)
		}
		err = copyPartition(ctx, dev, p, src)
		src.Close()
		if err != nil {
			return fmt.Errorf("writing partition %s: %w", p.Name, err)
		}
	}
	return dev.Sync()
}

// copyPartition writes src over the whole of partition p of dev, zeros
// after src's end: what was on the disk before is gone.
func copyPartition(ctx context.Context, dev io.WriterAt, p *gpt.Partition, src io.Reader) error {
	w := io.NewOffsetWriter(dev, p.GetStart())
	buf := make([]byte, mib)
	for left := p.GetSize(); left > 0; {
		if err := ctx.Err(); err != nil {
			return err
		}
		chunk := buf[:min(int64(len(buf)), left)]
		n, err := io.ReadFull(src, chunk)
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			clear(chunk[n:])
		} else if err != nil {
			return err
		}
		if _, err := w.Write(chunk); err != nil {
			return err
		}
		left -= int64(len(chunk))
	}
	return nil
}

// Partition is where a partition of the installed disk is: what a
// firmware boot entry names.
type Partition struct {
	Number         int    // 1-based, as in the GPT
	Start, Sectors uint64 // in 512-byte sectors
	GUID           string // the partition's unique GUID
}

// ESP returns where the disk's EFI system partition is.
func (u *Unpacked) ESP() (Partition, error) {
	p := partitionNamed(u.table, "EFI")
	if p == nil {
		return Partition{}, errors.New("install medium: the disk has no EFI system partition")
	}
	return Partition{Number: p.Index, Start: p.Start, Sectors: uint64(p.GetSize()) / sectorSize, GUID: p.GUID}, nil
}

// FreshTable returns a new GPT with old's disk GUID and partitions (the
// unused entries dropped): go-diskfs places its backup header and last
// usable sector from the size of the disk it is written to, where a
// table read from a disk keeps that disk's.
func FreshTable(old *gpt.Table) *gpt.Table {
	t := &gpt.Table{GUID: old.GUID, ProtectiveMBR: true, LogicalSectorSize: sectorSize, PhysicalSectorSize: sectorSize}
	for _, p := range old.Partitions {
		if p.Type == gpt.Unused {
			continue
		}
		t.Partitions = append(t.Partitions, &gpt.Partition{Index: p.Index, Start: p.Start, End: p.End, Size: p.Size,
			Type: p.Type, Name: p.Name, GUID: p.GUID, Attributes: p.Attributes})
	}
	return t
}
