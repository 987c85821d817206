// Package ephemeral lays out the EPHEMERAL partition of a Cairn disk: it is
// made at first boot to fill the space after the last partition, and grown
// when the disk has grown. It edits the GPT only; making and growing the
// filesystem is left to the caller's tools (mke2fs, resize2fs).
package ephemeral

import (
	"fmt"
	"io"
	"os"

	"github.com/diskfs/go-diskfs/partition/gpt"
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

// Ensure makes sure the disk at path (a block device or an image file) has
// an EPHEMERAL partition reaching to the end of the disk. It rewrites the
// GPT (both copies) only when it creates or grows the partition.
func Ensure(path string) (*Result, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil || size == 0 {
		return nil, fmt.Errorf("size of %s: %d bytes, %v", path, size, err)
	}
	old, err := gpt.Read(f, sectorSize, sectorSize)
	if err != nil {
		return nil, fmt.Errorf("read the GPT of %s: %w", path, err)
	}
	// A fresh table with the same partitions: go-diskfs places the backup
	// header and the last usable sector from the disk's current size.
	table := &gpt.Table{GUID: old.GUID, ProtectiveMBR: true, LogicalSectorSize: sectorSize, PhysicalSectorSize: sectorSize}
	var eph *gpt.Partition
	var lastEnd uint64
	lastIndex := 0
	for _, p := range old.Partitions {
		if p.Type == gpt.Unused {
			continue
		}
		lastIndex = max(lastIndex, p.Index)
		np := &gpt.Partition{Index: p.Index, Start: p.Start, End: p.End, Size: p.Size, Type: p.Type, Name: p.Name, GUID: p.GUID, Attributes: p.Attributes}
		table.Partitions = append(table.Partitions, np)
		if p.Name == Label {
			eph = np
		} else {
			lastEnd = max(lastEnd, p.End)
		}
	}
	lastUsable := uint64(size/sectorSize) - gptTail - 2
	res := &Result{}
	switch {
	case eph == nil:
		start := (lastEnd/align + 1) * align
		if start+minGrowth/sectorSize > lastUsable {
			return nil, fmt.Errorf("%s: no room for %s after sector %d (disk is %d bytes)", path, Label, lastEnd, size)
		}
		eph = &gpt.Partition{Index: lastIndex + 1, Start: start, Type: gpt.LinuxFilesystem, Name: Label}
		table.Partitions = append(table.Partitions, eph)
		res.Change = Created
	case eph.End != lastEnd && (lastUsable-eph.End)*sectorSize >= minGrowth:
		res.Change = Grown
	}
	if res.Change != Unchanged {
		// End on a 1 MiB boundary minus one, like partitioning tools do.
		eph.End = (lastUsable+1)/align*align - 1
		eph.Size = (eph.End - eph.Start + 1) * sectorSize
		if err := table.Write(f, size); err != nil {
			return nil, fmt.Errorf("write the GPT of %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			return nil, err
		}
	}
	res.Number = eph.Index
	res.Size = int64(eph.End-eph.Start+1) * sectorSize
	return res, nil
}
