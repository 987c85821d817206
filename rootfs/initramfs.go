package rootfs

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"
)

// initramfsDirs are the initramfs's mount points besides the parents of
// its files.
var initramfsDirs = []string{"dev", "proc", "sys", "newroot"}

// console is /dev/console, which the kernel opens as init's stdio before
// init runs, so it must exist in the initramfs itself.
var console = cpio.Info{Name: "dev/console", Mode: cpio.S_IFCHR | 0o600, Rmajor: 5, Rminor: 1}

// writeInitramfs writes files, their parent directories, initramfsDirs and
// /dev/console to out as an uncompressed newc cpio archive. Records are
// sorted by name, numbered from 1 in that order, owned by root and dated
// epoch, so the archive depends only on its contents.
func writeInitramfs(files []file, out string, epoch int64) error {
	records := []cpio.Info{console}
	byName := map[string]file{}
	dirs := map[string]bool{}
	for _, d := range initramfsDirs {
		dirs[d] = true
	}
	for _, f := range files {
		byName[f.name] = f
		records = append(records, cpio.Info{Name: f.name, Mode: cpio.S_IFREG | uint64(f.perm)})
		for d := path.Dir(f.name); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		records = append(records, cpio.Info{Name: d, Mode: cpio.S_IFDIR | 0o755, NLink: 2})
	}
	slices.SortFunc(records, func(a, b cpio.Info) int { return strings.Compare(a.Name, b.Name) })

	o, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	defer o.Close()
	bw := bufio.NewWriter(o)
	w := cpio.Newc.Writer(bw)
	for i, info := range records {
		info.Ino = uint64(i + 1)
		info.MTime = uint64(epoch)
		if info.NLink == 0 {
			info.NLink = 1
		}
		if err := writeRecord(w, info, byName[info.Name]); err != nil {
			return fmt.Errorf("write initramfs %s: %s: %w", out, info.Name, err)
		}
	}
	if err := cpio.WriteTrailer(w); err != nil {
		return fmt.Errorf("write initramfs %s: %w", out, err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write initramfs %s: %w", out, err)
	}
	if err := o.Close(); err != nil {
		return fmt.Errorf("write initramfs %s: %w", out, err)
	}
	return nil
}

// writeRecord writes one record; f supplies the contents of regular files.
func writeRecord(w cpio.RecordWriter, info cpio.Info, f file) error {
	if info.Mode&cpio.S_IFMT != cpio.S_IFREG {
		return w.WriteRecord(cpio.Record{Info: info})
	}
	if f.src == "" {
		return w.WriteRecord(cpio.StaticRecord(f.data, info))
	}
	in, err := os.Open(f.src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if st.Size() > math.MaxUint32 {
		return fmt.Errorf("%s is too large for a newc archive", f.src)
	}
	info.FileSize = uint64(st.Size())
	return w.WriteRecord(cpio.Record{ReaderAt: io.NewSectionReader(in, 0, st.Size()), Info: info})
}
