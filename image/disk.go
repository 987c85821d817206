package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/google/uuid"
	"golang.org/x/sys/unix"
)

// Disk describes a raw Cairn disk: a GPT with the EFI system partition and
// the STATE partition. The rest of the disk is left unpartitioned for the
// EPHEMERAL partition that the first boot makes.
type Disk struct {
	Size            int64             // bytes, whole disk (default 2 GiB when 0)
	ESP             string            // the EFI system partition's image, as WriteESP wrote it
	State           map[string][]byte // files in the STATE filesystem: relative path -> content (mode 0600 for all)
	SourceDateEpoch int64             // every timestamp in the image, in seconds since 1970
	Seed            []byte            // digest of all inputs; disk/partition GUIDs and fs UUIDs/serials are derived from it
}

// Disk layout, with 512-byte sectors and 1 MiB aligned partitions.
const (
	sectorSize  = 512
	mib         = 1 << 20
	defaultSize = 2 << 30
	espStart    = 1 * mib
	espSize     = 256 * mib
	stateStart  = espStart + espSize
	stateSize   = 100 * mib
	minSize     = stateStart + stateSize + mib // room for the backup GPT
)

// FAT timestamps run from 1980 to 2107.
var (
	minEpoch = time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	maxEpoch = time.Date(2107, 12, 31, 23, 59, 58, 0, time.UTC).Unix()
)

// idNamespace is the namespace of the UUIDs derived from a disk's seed.
var idNamespace = uuid.MustParse("25d4edce-0014-4f7e-8eb5-56a1a52653c7")

var (
	ukiName   = regexp.MustCompile(`^[A-Za-z0-9._-]+\.efi$`)
	statePath = regexp.MustCompile(`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)
)

// WriteRaw writes the raw disk image described by d to out. The same d and
// the same host tools give a byte-identical file, whatever the time, the
// directory or the environment of the build. The file is sparse: blocks
// that are all zero are left as holes.
func WriteRaw(ctx context.Context, d Disk, out string) error {
	if d.Size == 0 {
		d.Size = defaultSize
	}
	if err := d.validate(); err != nil {
		return err
	}
	work, err := os.MkdirTemp(filepath.Dir(out), ".cairn-image-")
	if err != nil {
		return fmt.Errorf("creating work directory: %w", err)
	}
	defer os.RemoveAll(work)

	state, err := buildState(ctx, work, d.State, d.SourceDateEpoch,
		deriveID(d.Seed, "filesystem STATE"), deriveID(d.Seed, "hash seed STATE"))
	if err != nil {
		return fmt.Errorf("building STATE partition: %w", err)
	}

	raw := filepath.Join(work, "disk.raw")
	if err := createSparse(raw, d.Size); err != nil {
		return err
	}
	f, err := os.OpenFile(raw, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening disk: %w", err)
	}
	defer f.Close()
	table := &gpt.Table{
		LogicalSectorSize:  sectorSize,
		PhysicalSectorSize: sectorSize,
		ProtectiveMBR:      true,
		GUID:               deriveID(d.Seed, "disk").String(),
		Partitions: []*gpt.Partition{
			partition(1, "EFI", gpt.EFISystemPartition, espStart, espSize, d.Seed),
			partition(2, "STATE", gpt.LinuxFilesystem, stateStart, stateSize, d.Seed),
		},
	}
	if err := table.Write(f, d.Size); err != nil {
		return fmt.Errorf("writing partition table: %w", err)
	}
	if err := copyNonZero(ctx, f, d.ESP, espStart); err != nil {
		return fmt.Errorf("copying EFI system partition: %w", err)
	}
	if err := copyNonZero(ctx, f, state, stateStart); err != nil {
		return fmt.Errorf("copying STATE partition: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing disk: %w", err)
	}
	if err := os.Rename(raw, out); err != nil {
		return fmt.Errorf("moving disk into place: %w", err)
	}
	return nil
}

// validate checks d, with its Size already defaulted.
func (d Disk) validate() error {
	switch {
	case d.Size < minSize || d.Size%sectorSize != 0:
		return fmt.Errorf("disk size %d: must be a multiple of %d and at least %d", d.Size, sectorSize, minSize)
	case d.ESP == "":
		return errors.New("no EFI system partition")
	case len(d.Seed) == 0:
		return errors.New("no seed")
	case d.SourceDateEpoch < minEpoch || d.SourceDateEpoch > maxEpoch:
		return errEpoch(d.SourceDateEpoch)
	}
	if st, err := os.Stat(d.ESP); err != nil {
		return fmt.Errorf("EFI system partition: %w", err)
	} else if st.Size() != espSize {
		return fmt.Errorf("EFI system partition %s: %d bytes, want %d", d.ESP, st.Size(), espSize)
	}
	for p := range d.State {
		if !statePath.MatchString(p) || !filepath.IsLocal(p) || p != filepath.Clean(p) {
			return fmt.Errorf("STATE path %q: must be a clean relative path using only letters, digits, '.', '_', '-' and '/'", p)
		}
	}
	return nil
}

// errEpoch says why the time epoch cannot stamp a disk's files.
func errEpoch(epoch int64) error {
	return fmt.Errorf("SOURCE_DATE_EPOCH %d: FAT can only hold times from %d (1980) to %d (2107)", epoch, minEpoch, maxEpoch)
}

// partition returns the GPT entry for a partition at start of size bytes,
// with its GUID derived from seed and name.
func partition(index int, name string, typ gpt.Type, start, size int64, seed []byte) *gpt.Partition {
	return &gpt.Partition{
		Index: index,
		Start: uint64(start / sectorSize),
		Size:  uint64(size),
		Type:  typ,
		Name:  name,
		GUID:  deriveID(seed, "partition "+name).String(),
	}
}

// deriveID returns the UUID for purpose on a disk built from seed: a
// name-based UUID (RFC 9562 version 8) hashing the namespace, purpose and
// seed with SHA-256.
func deriveID(seed []byte, purpose string) uuid.UUID {
	return uuid.NewHash(sha256.New(), idNamespace, append([]byte(purpose+"\x00"), seed...), 8)
}

// createSparse creates the file path as a hole of size bytes.
func createSparse(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Base(path), err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("sizing %s: %w", filepath.Base(path), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", filepath.Base(path), err)
	}
	return nil
}

// blockSize is the granularity at which copyNonZero leaves holes.
const blockSize = 4096

var zeroBlock [blockSize]byte

// copyNonZero copies the file src into dst at offset off, leaving holes
// for blocks that are all zero, so that holes stay holes in a sparse dst.
func copyNonZero(ctx context.Context, dst io.WriterAt, src string, off int64) error {
	return nonZeroBlocks(ctx, src, func(pos int64, blk []byte) error {
		_, err := dst.WriteAt(blk, off+pos)
		return err
	})
}

// nonZeroBlocks calls fn with each block of the file path, in order, that
// is not all zero, and its offset. The blocks are those at multiples of
// blockSize, whatever the file system's own block size; it reads only the
// data regions of a sparse file: the holes are never read.
func nonZeroBlocks(ctx context.Context, path string, fn func(off int64, blk []byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	buf := make([]byte, 256*blockSize)
	for pos := int64(0); pos < st.Size(); {
		data, err := f.Seek(pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("finding data in %s: %w", path, err)
		}
		hole, err := f.Seek(data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("finding a hole in %s: %w", path, err)
		}
		// Whole blocks, from where the last region's reading stopped.
		data = max(pos, data/blockSize*blockSize)
		hole = min(st.Size(), (hole+blockSize-1)/blockSize*blockSize)
		for pos = data; pos < hole; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if err != nil {
				return err
			}
			for b := 0; b < n; b += blockSize {
				blk := buf[b:min(b+blockSize, n)]
				if bytes.Equal(blk, zeroBlock[:len(blk)]) {
					continue
				}
				if err := fn(pos+int64(b), blk); err != nil {
					return err
				}
			}
			pos += int64(n)
		}
	}
	return nil
}
