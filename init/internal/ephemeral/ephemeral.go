// Package ephemeral lays out the EPHEMERAL partition of a Cairn disk: it is
// made at first boot to fill the space after the last partition, and grown
// when the disk has grown. It edits the GPT only; making and growing the
// filesystem is left to the caller's tools (mke2fs, resize2fs).
package ephemeral

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/cairn-os/cairn/image"
)

// Label is the GPT partition name of EPHEMERAL.
const Label = "EPHEMERAL"

const (
	sectorSize = 512
	align      = 2048 // sectors: 1 MiB
	// minGrowth is the least extra space worth growing into.
	minGrowth = 64 << 20
	// gptTail is the backup partition array and header at the end of the
	// disk, in sectors.
	gptTail = 33
)

// Change says what Ensure did.
type Change int

const (
	Unchanged Change = iota
	Created
	Grown
)

func (c Change) String() string {
	return [...]string{"unchanged", "created", "grown"}[c]
}

// Result of Ensure.
type Result struct {
	Change Change
	// Number is the partition's number on the disk (1-based, as in
	// /dev/vda3).
	Number int
	Size   int64 // bytes
}

// disk is a disk's GPT, read afresh, with what Ensure and Remove need.
type disk struct {
	size      int64
	table     *gpt.Table     // the partitions, in a fresh table for this size
	eph       *gpt.Partition // EPHEMERAL in table, nil if none
	lastEnd   uint64         // the end of the last other partition
	lastIndex int            // the highest partition number
}

// read reads the GPT of f, the disk at path.
func read(f *os.File, path string) (*disk, error) {
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil || size == 0 {
		return nil, fmt.Errorf("size of %s: %d bytes, %v", path, size, err)
	}
	old, err := gpt.Read(f, sectorSize, sectorSize)
	if err != nil {
		return nil, fmt.Errorf("read the GPT of %s: %w", path, err)
	}
	// A fresh table with the same partitions, for the disk's current size.
	d := &disk{size: size, table: image.FreshTable(old)}
	for _, p := range d.table.Partitions {
		d.lastIndex = max(d.lastIndex, p.Index)
		if p.Name == Label {
			d.eph = p
		} else {
			d.lastEnd = max(d.lastEnd, p.End)
		}
	}
	return d, nil
}

// write writes both copies of the table and syncs.
func (d *disk) write(f *os.File, path string) error {
	if err := d.table.Write(f, d.size); err != nil {
		return fmt.Errorf("write the GPT of %s: %w", path, err)
	}
	return f.Sync()
}

// Ensure makes sure the disk at path (a block device or an image file) has
// an EPHEMERAL partition reaching to the end of the disk. It rewrites the
// GPT (both copies) only when it creates or grows the partition.
func Ensure(path string) (*Result, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d, err := read(f, path)
	if err != nil {
		return nil, err
	}
	eph, lastEnd, size := d.eph, d.lastEnd, d.size
	lastUsable := uint64(size/sectorSize) - gptTail - 2
	res := &Result{}
	switch {
	case eph == nil:
		start := (lastEnd/align + 1) * align
		if start+minGrowth/sectorSize > lastUsable {
			return nil, fmt.Errorf("%s: no room for %s after sector %d (disk is %d bytes)", path, Label, lastEnd, size)
		}
		eph = &gpt.Partition{Index: d.lastIndex + 1, Start: start, Type: gpt.LinuxFilesystem, Name: Label}
		d.table.Partitions = append(d.table.Partitions, eph)
		res.Change = Created
	case eph.End != lastEnd && (lastUsable-eph.End)*sectorSize >= minGrowth:
		res.Change = Grown
	}
	if res.Change != Unchanged {
		// End on a 1 MiB boundary minus one, like partitioning tools do.
		eph.End = (lastUsable+1)/align*align - 1
		eph.Size = (eph.End - eph.Start + 1) * sectorSize
		if err := d.write(f, path); err != nil {
			return nil, err
		}
	}
	res.Number = eph.Index
	res.Size = int64(eph.End-eph.Start+1) * sectorSize
	return res, nil
}

// wipeBytes is how much of EPHEMERAL's start Remove zeroes: the ext4
// superblock and group descriptors, so that nothing finds the old
// filesystem again.
const wipeBytes = 1 << 20

// Remove takes EPHEMERAL out of the GPT of the disk at path, its
// filesystem's start zeroed first, so that the next Ensure makes it anew;
// it reports whether there was one. The partition must not be mounted.
func Remove(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	d, err := read(f, path)
	if err != nil || d.eph == nil {
		return false, err
	}
	if _, err := f.WriteAt(make([]byte, wipeBytes), int64(d.eph.Start)*sectorSize); err != nil {
		return false, fmt.Errorf("wipe %s on %s: %w", Label, path, err)
	}
	d.table.Partitions = slices.DeleteFunc(d.table.Partitions, func(p *gpt.Partition) bool { return p == d.eph })
	return true, d.write(f, path)
}
