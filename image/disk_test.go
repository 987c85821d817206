package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const testEpoch = 1700000000 // 2023-11-14 22:13:20 UTC

var testState = map[string][]byte{
	"config.yaml":         []byte("version: v1alpha1\nhostname: node-1\n"),
	"etc/cairn/node.yaml": []byte("role: worker\n"),
}

// testESP returns the EFI system partition of testDisk, with a fake UKI
// of a few MB written in dir.
func testESP(t *testing.T, dir string) ESP {
	t.Helper()
	needFile(t, bootloaderPath, "systemd-boot-efi")
	seed := sha256.Sum256([]byte("test boot inputs"))
	return ESP{
		Bootloader:      bootloaderPath,
		UKIs:            map[string]string{"cairn-0.1.0.efi": writeFile(t, dir, "uki.efi", randomBytes(3<<20, 3))},
		SourceDateEpoch: testEpoch,
		Seed:            seed[:],
	}
}

// testDisk returns a 1 GiB disk with the ESP of testESP, written in dir.
func testDisk(t *testing.T, dir string) Disk {
	t.Helper()
	needTools(t, mkfsVfat, mmd, mcopy, mke2fs, debugfs)
	esp := filepath.Join(dir, "esp.img")
	if err := WriteESP(context.Background(), testESP(t, dir), esp); err != nil {
		t.Fatal(err)
	}
	seed := sha256.Sum256([]byte("test inputs"))
	return Disk{
		Size:            1 << 30,
		ESP:             esp,
		State:           testState,
		SourceDateEpoch: testEpoch,
		Seed:            seed[:],
	}
}

func TestWriteRaw(t *testing.T) {
	dir := t.TempDir()
	d := testDisk(t, dir)
	raw := filepath.Join(dir, "disk.raw")
	if err := WriteRaw(context.Background(), d, raw); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("sgdisk", func(t *testing.T) {
		needTools(t, sgdisk)
		verify, _, err := sgdisk.run(ctx, nil, "-v", raw)
		if err != nil || !strings.Contains(string(verify), "No problems found") {
			t.Errorf("sgdisk -v: %v\n%s", err, verify)
		}
		list, _, err := sgdisk.run(ctx, nil, "-p", raw)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"1            2048          526335   256.0 MiB   EF00  EFI",
			"2          526336          731135   100.0 MiB   8300  STATE",
		} {
			if !strings.Contains(string(list), want) {
				t.Errorf("sgdisk -p lacks %q:\n%s", want, list)
			}
		}
	})

	t.Run("partitions", func(t *testing.T) {
		table := readTable(t, raw)
		if got, want := table.GUID, deriveID(d.Seed, "disk").String(); !strings.EqualFold(got, want) {
			t.Errorf("disk GUID %s, want %s", got, want)
		}
		type part struct {
			Index int
			Name  string
			Type  gpt.Type
			Start int64
			Size  int64
			GUID  string
		}
		var got []part
		for _, p := range table.Partitions {
			got = append(got, part{p.Index, p.Name, p.Type, p.GetStart(), p.GetSize(), strings.ToLower(p.GUID)})
		}
		want := []part{
			{1, "EFI", gpt.EFISystemPartition, 1 << 20, 256 << 20, deriveID(d.Seed, "partition EFI").String()},
			{2, "STATE", gpt.LinuxFilesystem, 257 << 20, 100 << 20, deriveID(d.Seed, "partition STATE").String()},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("partitions (-want +got):\n%s", diff)
		}
	})

	t.Run("ESP", func(t *testing.T) {
		needTools(t, fsckVfat, mdir, mtype)
		esp := extract(t, raw, espStart, espSize)
		if out, _, err := fsckVfat.run(ctx, nil, "-n", esp); err != nil {
			t.Errorf("fsck.vfat -n: %v\n%s", err, out)
		}
		env := []string{"MTOOLS_SKIP_CHECK=1"}
		list, _, err := mdir.run(ctx, env, "-i", esp, "-/", "-b", "::")
		if err != nil {
			t.Fatal(err)
		}
		want := []string{
			"::/EFI/", "::/EFI/BOOT/", "::/EFI/BOOT/BOOTX64.EFI",
			"::/EFI/Linux/", "::/EFI/Linux/cairn-0.1.0.efi",
			"::/loader/", "::/loader/loader.conf",
		}
		if diff := cmp.Diff(want, strings.Fields(string(list)), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
			t.Errorf("ESP files (-want +got):\n%s", diff)
		}
		conf, _, err := mtype.run(ctx, env, "-i", esp, "::/loader/loader.conf")
		if err != nil {
			t.Fatal(err)
		}
		if string(conf) != "timeout 0\n" {
			t.Errorf("loader.conf is %q, want %q", conf, "timeout 0\n")
		}
		for _, f := range []struct{ path, want string }{
			{"::/EFI/BOOT/BOOTX64.EFI", bootloaderPath},
			{"::/EFI/Linux/cairn-0.1.0.efi", filepath.Join(dir, "uki.efi")},
		} {
			got, _, err := mtype.run(ctx, env, "-i", esp, f.path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, readFile(t, f.want)) {
				t.Errorf("%s differs from %s", f.path, f.want)
			}
		}
	})

	t.Run("STATE", func(t *testing.T) {
		needTools(t, e2fsck)
		state := extract(t, raw, stateStart, stateSize)
		if out, _, err := e2fsck.run(ctx, nil, "-fn", state); err != nil {
			t.Errorf("e2fsck -fn: %v\n%s", err, out)
		}
		for path, want := range testState {
			got, _, err := debugfs.run(ctx, nil, "-R", "cat /"+path, state)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s is %q, want %q", path, got, want)
			}
		}
		for _, f := range []struct{ path, mode string }{
			{"/", "0755"}, {"/etc", "0700"}, {"/etc/cairn", "0700"},
			{"/config.yaml", "0600"}, {"/etc/cairn/node.yaml", "0600"},
		} {
			stat, _, err := debugfs.run(ctx, nil, "-R", "stat "+f.path, state)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				"Mode:  " + f.mode, "User:     0   Group:     0",
				"ctime: 0x6553f100:", "atime: 0x6553f100:", "mtime: 0x6553f100:",
			} {
				if !strings.Contains(string(stat), want) {
					t.Errorf("stat %s lacks %q:\n%s", f.path, want, stat)
				}
			}
		}
	})

	t.Run("sparse", func(t *testing.T) {
		st, err := os.Stat(raw)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != d.Size {
			t.Errorf("size %d, want %d", st.Size(), d.Size)
		}
		if used := diskUsage(t, raw); used > 32<<20 {
			t.Errorf("disk uses %d bytes, want a sparse file under 32 MiB", used)
		}
	})
}

// TestWriteRawReproducible builds the same disk twice, in different
// directories, at times more than FAT's 2-second resolution apart, and in
// different time zones.
func TestWriteRawReproducible(t *testing.T) {
	var disks []string
	for i, tz := range []string{"UTC", "Asia/Tokyo"} {
		if i > 0 {
			time.Sleep(2100 * time.Millisecond)
		}
		t.Setenv("TZ", tz)
		dir := t.TempDir()
		raw := filepath.Join(dir, "disk.raw")
		if err := WriteRaw(context.Background(), testDisk(t, dir), raw); err != nil {
			t.Fatal(err)
		}
		disks = append(disks, raw)
	}
	if !sameFiles(t, disks[0], disks[1]) {
		t.Error("two builds of the same disk differ")
	}
}

func TestWriteRawInvalid(t *testing.T) {
	esp := writeFile(t, t.TempDir(), "esp.img", nil)
	if err := os.Truncate(esp, espSize); err != nil {
		t.Fatal(err)
	}
	valid := Disk{
		ESP:             esp,
		State:           map[string][]byte{"config.yaml": nil},
		SourceDateEpoch: testEpoch,
		Seed:            []byte("seed"),
	}
	tests := []struct {
		name   string
		change func(*Disk)
		want   string
	}{
		{"too small", func(d *Disk) { d.Size = 300 << 20 }, "disk size"},
		{"odd size", func(d *Disk) { d.Size = 1<<30 + 1 }, "disk size"},
		{"no ESP", func(d *Disk) { d.ESP = "" }, "no EFI system partition"},
		{"ESP missing", func(d *Disk) { d.ESP += ".gone" }, "no such file"},
		{"ESP of another size", func(d *Disk) { d.ESP = writeFile(t, t.TempDir(), "esp.img", []byte("x")) }, "1 bytes, want 268435456"},
		{"no seed", func(d *Disk) { d.Seed = nil }, "no seed"},
		{"epoch before 1980", func(d *Disk) { d.SourceDateEpoch = 0 }, "SOURCE_DATE_EPOCH 0"},
		{"STATE path absolute", func(d *Disk) { d.State = map[string][]byte{"/etc/x": nil} }, `STATE path "/etc/x"`},
		{"STATE path escapes", func(d *Disk) { d.State = map[string][]byte{"../x": nil} }, `STATE path "../x"`},
		{"STATE path not clean", func(d *Disk) { d.State = map[string][]byte{"a/./x": nil} }, `STATE path "a/./x"`},
		{"STATE path with space", func(d *Disk) { d.State = map[string][]byte{"a b": nil} }, `STATE path "a b"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := valid
			tt.change(&d)
			err := WriteRaw(context.Background(), d, filepath.Join(t.TempDir(), "disk.raw"))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("WriteRaw() error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestWriteESPInvalid(t *testing.T) {
	valid := ESP{
		Bootloader:      "BOOTX64.EFI",
		UKIs:            map[string]string{"cairn-0.1.0.efi": "uki.efi"},
		SourceDateEpoch: testEpoch,
		Seed:            []byte("seed"),
	}
	tests := []struct {
		name   string
		change func(*ESP)
		want   string
	}{
		{"no bootloader", func(e *ESP) { e.Bootloader = "" }, "no bootloader"},
		{"no UKIs", func(e *ESP) { e.UKIs = nil }, "no UKIs"},
		{"no seed", func(e *ESP) { e.Seed = nil }, "no seed"},
		{"epoch after 2107", func(e *ESP) { e.SourceDateEpoch = maxEpoch + 2 }, "FAT can only hold times"},
		{"UKI not .efi", func(e *ESP) { e.UKIs = map[string]string{"cairn": "uki"} }, `UKI name "cairn"`},
		{"UKI in directory", func(e *ESP) { e.UKIs = map[string]string{"a/b.efi": "uki"} }, `UKI name "a/b.efi"`},
		{"UKI names equal ignoring case", func(e *ESP) { e.UKIs = map[string]string{"a.efi": "x", "A.efi": "y"} }, "unique ignoring case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := valid
			tt.change(&e)
			err := WriteESP(context.Background(), e, filepath.Join(t.TempDir(), "esp.img"))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("WriteESP() error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestDeriveID pins the derivation: changing it would change the GUIDs of
// every disk built from the same inputs.
func TestDeriveID(t *testing.T) {
	tests := []struct {
		seed, purpose, want string
	}{
		{"seed", "disk", "b0f8798e-1902-8b39-b42e-f3af22ec01de"},
		{"seed", "partition EFI", "f21af74d-533c-8355-b11e-18416ff6e124"},
		{"other seed", "disk", "bc1ea3e4-3db2-8482-861b-380a11fbb9e3"},
	}
	for _, tt := range tests {
		if got := deriveID([]byte(tt.seed), tt.purpose).String(); got != tt.want {
			t.Errorf("deriveID(%q, %q) = %s, want %s", tt.seed, tt.purpose, got, tt.want)
		}
	}
}

// extract copies size bytes at off in the file disk to a new file and
// returns its path.
func extract(t *testing.T, disk string, off, size int64) string {
	t.Helper()
	in, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	path := filepath.Join(t.TempDir(), "part.img")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, io.NewSectionReader(in, off, size)); err != nil {
		t.Fatal(err)
	}
	return path
}

// sameFiles reports whether the files a and b hold the same bytes.
func sameFiles(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		na, erra := io.ReadFull(fa, ba)
		nb, errb := io.ReadFull(fb, bb)
		if !bytes.Equal(ba[:na], bb[:nb]) {
			return false
		}
		if errors.Is(erra, io.EOF) || errors.Is(erra, io.ErrUnexpectedEOF) {
			return errors.Is(errb, io.EOF) || errors.Is(errb, io.ErrUnexpectedEOF)
		}
		if erra != nil || errb != nil {
			t.Fatal(erra, errb)
		}
	}
}
