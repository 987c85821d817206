package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/klauspost/compress/zstd"
)

// The install medium: an ISO 9660 volume labelled MediumLabel that holds
// a Cairn disk as its partition table and the images of its partitions.
// Its EFI system partition image is also the ISO's El Torito EFI boot
// image, so the medium boots the disk's own UKI, whose init finds the
// medium and installs the disk (init/stage2/install_linux.go).
const (
	MediumLabel = "CAIRN_INSTALL"
	mediumTable = "/cairn/gpt.img"   // the disk's first MiB: protective MBR and GPT
	mediumESP   = "/cairn/esp.img"   // the EFI system partition, as it is on the disk
	mediumState = "/cairn/state.zst" // the STATE partition, zstd-compressed
)

// isoFormat is a hybrid ISO: El Torito EFI for a CD or a virtual drive,
// and a GPT naming the same EFI image for a USB stick, made by xorriso.
type isoFormat struct{}

func (isoFormat) Name() string { return "iso" }
func (isoFormat) Ext() string  { return ".iso" }
func (isoFormat) Sparse() bool { return false }

func (isoFormat) Convert(ctx context.Context, raw, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".iso-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "cairn"), 0o755); err != nil {
		return err
	}
	if err := writeMediumFiles(raw, tree); err != nil {
		return fmt.Errorf("iso: %w", err)
	}
	// SOURCE_DATE_EPOCH makes xorriso fix the volume's dates and UUID and
	// the GPT's GUIDs; Rock Ridge records the files' own times, fixed
	// here: the same disk gives the same ISO.
	epoch := time.Unix(0, 0)
	if err := filepath.WalkDir(tree, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(path, epoch, epoch)
	}); err != nil {
		return err
	}
	// --efi-boot-part --efi-boot-image: a GPT names the El Torito EFI
	// image as the EFI system partition, for firmware that boots the ISO
	// as a disk (a USB stick).
	_, _, err = xorriso.run(ctx, []string{"SOURCE_DATE_EPOCH=0"}, "-as", "mkisofs", "-quiet",
		"-o", out, "-V", MediumLabel, "-iso-level", "3", "-R",
		"-e", mediumESP[1:], "-no-emul-boot", "--efi-boot-part", "--efi-boot-image", tree)
	return err
}

// writeMediumFiles writes the medium's files of the raw disk into tree.
func writeMediumFiles(raw, tree string) error {
	f, err := os.Open(raw)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	table, err := gpt.Read(f, sectorSize, sectorSize)
	if err != nil {
		return fmt.Errorf("reading the disk's partition table: %w", err)
	}
	esp, state := partitionNamed(table, "EFI"), partitionNamed(table, "STATE")
	if esp == nil || state == nil {
		return errors.New("the disk has no EFI or no STATE partition")
	}
	copyTo := func(name string, r io.Reader, compress bool) error {
		out, err := os.Create(filepath.Join(tree, filepath.FromSlash(name)))
		if err != nil {
			return err
		}
		defer out.Close()
		w := io.Writer(out)
		var zw *zstd.Encoder
		if compress {
			// One goroutine: the frame is then the same bytes whatever
			// the machine.
			if zw, err = zstd.NewWriter(out, zstd.WithEncoderConcurrency(1)); err != nil {
				return err
			}
			w = zw
		}
		if _, err := io.Copy(w, r); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
		if zw != nil {
			if err := zw.Close(); err != nil {
				return err
			}
		}
		return out.Close()
	}
	if err := copyTo(mediumTable, io.NewSectionReader(f, 0, min(espStart, st.Size())), false); err != nil {
		return err
	}
	if err := copyTo(mediumESP, io.NewSectionReader(f, esp.GetStart(), esp.GetSize()), false); err != nil {
		return err
	}
	return copyTo(mediumState, io.NewSectionReader(f, state.GetStart(), state.GetSize()), true)
}

// partitionNamed returns t's partition called name, or nil.
func partitionNamed(t *gpt.Table, name string) *gpt.Partition {
	for _, p := range t.Partitions {
		if p.Name == name {
			return p
		}
	}
	return nil
}
