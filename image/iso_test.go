package image

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/partition/gpt"
)

// TestISO converts a Cairn disk to an ISO twice (the same bytes), checks
// with xorriso that it boots by El Torito EFI and as a GPT disk, then
// installs the disk from it onto a larger used disk and checks the
// result against the image: same partitions, same bytes.
func TestISO(t *testing.T) {
	needTools(t, xorriso, sgdisk)
	ctx := context.Background()
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	if err := WriteRaw(ctx, testDisk(t, dir), raw); err != nil {
		t.Fatal(err)
	}
	f, err := FormatByName("iso")
	if err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "cairn.iso")
	for _, out := range []string{iso, iso + ".again"} {
		if err := f.Convert(ctx, raw, out); err != nil {
			t.Fatal(err)
		}
	}
	if !sameFiles(t, iso, iso+".again") {
		t.Error("two conversions of the same disk differ")
	}

	eltorito, _, err := xorriso.run(ctx, nil, "-indev", iso, "-report_el_torito", "plain")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`El Torito boot img :\s+1\s+UEFI\s+y\s+none`).Match(eltorito) {
		t.Errorf("xorriso -report_el_torito: no bootable UEFI image:\n%s", eltorito)
	}
	area, _, err := xorriso.run(ctx, nil, "-indev", iso, "-report_system_area", "plain")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(area), "EFI boot partition") {
		t.Errorf("xorriso -report_system_area: no GPT for a USB stick:\n%s", area)
	}

	m, err := OpenMedium(iso)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	u, err := Unpack(m, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range testState {
		if got, err := u.StateFile("/" + path); err != nil || !bytes.Equal(got, want) {
			t.Errorf("STATE %s on the medium: %q, %v; want %q", path, got, err, want)
		}
	}

	t.Run("install", func(t *testing.T) {
		const size = 3 << 30
		target := filepath.Join(t.TempDir(), "target.raw")
		if err := createSparse(target, size); err != nil {
			t.Fatal(err)
		}
		dev, err := os.OpenFile(target, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close()
		// What was there before: data where the partitions go.
		for _, off := range []int64{espStart + 200*mib, stateStart + 90*mib} {
			if _, err := dev.WriteAt(bytes.Repeat([]byte("old"), 1000), off); err != nil {
				t.Fatal(err)
			}
		}
		if err := u.Install(ctx, m, dev, size); err != nil {
			t.Fatal(err)
		}
		if verify, _, err := sgdisk.run(ctx, nil, "-v", target); err != nil || !strings.Contains(string(verify), "No problems found") {
			t.Errorf("sgdisk -v: %v\n%s", err, verify)
		}
		want, got := readTable(t, raw), readTable(t, target)
		if want.GUID != got.GUID || len(got.Partitions) != 2 {
			t.Fatalf("installed disk %s with %d partitions, want the image's %s with 2", got.GUID, len(got.Partitions), want.GUID)
		}
		for i, p := range got.Partitions {
			w := want.Partitions[i]
			if p.Name != w.Name || p.GUID != w.GUID || p.Start != w.Start || p.Size != w.Size {
				t.Errorf("partition %d: %s %s at %d, %d bytes; want %s %s at %d, %d bytes", i+1, p.Name, p.GUID, p.Start, p.Size, w.Name, w.GUID, w.Start, w.Size)
			}
			if !sameRange(t, raw, target, w.GetStart(), w.GetSize()) {
				t.Errorf("partition %s: not the image's bytes", p.Name)
			}
		}
	})

	t.Run("too small", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "small.raw")
		if err := createSparse(target, 300*mib); err != nil {
			t.Fatal(err)
		}
		dev, err := os.OpenFile(target, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close()
		err = u.Install(ctx, m, dev, 300*mib)
		if want := "300 MiB, too small: a Cairn disk needs at least 422 MiB"; err == nil || err.Error() != want {
			t.Errorf("Install on 300 MiB: %v, want %q", err, want)
		}
		if used := diskUsage(t, target); used != 0 {
			t.Errorf("the refused disk was written: %d bytes", used)
		}
	})

	if _, err := OpenMedium(raw); err == nil {
		t.Error("OpenMedium of a raw disk: no error")
	}
}

// readTable reads the GPT of the disk image at path.
func readTable(t *testing.T, path string) *gpt.Table {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table, err := gpt.Read(f, sectorSize, sectorSize)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// sameRange says whether the files a and b hold the same size bytes at off.
func sameRange(t *testing.T, a, b string, off, size int64) bool {
	t.Helper()
	read := func(path string) []byte {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		data, err := io.ReadAll(io.NewSectionReader(f, off, size))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	return bytes.Equal(read(a), read(b))
}
