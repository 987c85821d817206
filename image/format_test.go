package image

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFormats(t *testing.T) {
	if diff := cmp.Diff([]string{"gcp", "iso", "qcow2", "raw", "vhd", "vmdk"}, Formats()); diff != "" {
		t.Errorf("Formats() (-want +got):\n%s", diff)
	}
	for _, name := range Formats() {
		f, err := FormatByName(name)
		if err != nil || f.Name() != name {
			t.Errorf("FormatByName(%q) = %v, %v", name, f, err)
		}
	}
	_, err := FormatByName("vdi")
	if want := `unknown image format "vdi": valid formats are gcp, iso, qcow2, raw, vhd, vmdk`; err == nil || err.Error() != want {
		t.Errorf("FormatByName(vdi) error %v, want %q", err, want)
	}
}

func TestConvert(t *testing.T) {
	raw := sparseRaw(t)
	ctx := context.Background()
	tests := []struct {
		format string
		tools  []tool
		check  func(t *testing.T, out string)
	}{
		{"raw", nil, func(t *testing.T, out string) {
			if !sameFiles(t, raw, out) {
				t.Error("copy differs from the raw disk")
			}
			if used := diskUsage(t, out); used > 1<<20 {
				t.Errorf("copy uses %d bytes, want a sparse file", used)
			}
		}},
		{"qcow2", []tool{qemuImg}, func(t *testing.T, out string) {
			if msg, _, err := qemuImg.run(ctx, nil, "compare", "-f", "raw", "-F", "qcow2", raw, out); err != nil {
				t.Errorf("qemu-img compare: %v\n%s", err, msg)
			}
		}},
		{"vhd", []tool{qemuImg}, func(t *testing.T, out string) {
			checkImage(t, out, "vpc", 64<<20)
			if msg, _, err := qemuImg.run(ctx, nil, "compare", "-f", "raw", "-F", "vpc", raw, out); err != nil {
				t.Errorf("qemu-img compare: %v\n%s", err, msg)
			}
			// Fixed: the disk, then the 512-byte footer.
			if st, err := os.Stat(out); err != nil || st.Size() != 64<<20+512 {
				t.Errorf("size %v (%v), want the disk and a footer", st.Size(), err)
			}
		}},
		{"vmdk", []tool{qemuImg}, func(t *testing.T, out string) {
			checkImage(t, out, "vmdk", 64<<20)
			if msg, _, err := qemuImg.run(ctx, nil, "check", "-f", "vmdk", out); err != nil {
				t.Errorf("qemu-img check: %v\n%s", err, msg)
			}
			if msg, _, err := qemuImg.run(ctx, nil, "compare", "-f", "raw", "-F", "vmdk", raw, out); err != nil {
				t.Errorf("qemu-img compare: %v\n%s", err, msg)
			}
			info, _, err := qemuImg.run(ctx, nil, "info", "--output=json", out)
			if err != nil || !strings.Contains(string(info), `"create-type": "streamOptimized"`) {
				t.Errorf("qemu-img info: %s (%v), want create-type streamOptimized", info, err)
			}
		}},
		{"gcp", []tool{gnuTar, gzipTool}, func(t *testing.T, out string) {
			list, _, err := gnuTar.run(ctx, nil, "-tvzf", out)
			if err != nil {
				t.Fatal(err)
			}
			if f := strings.Fields(string(list)); len(f) < 6 || f[len(f)-1] != "disk.raw" || f[2] != "67108864" || f[1] != "0/0" {
				t.Errorf("tar -tvzf: %q, want disk.raw alone, 64 MiB, owned by 0/0", list)
			}
			dir := t.TempDir()
			if _, _, err := gnuTar.run(ctx, nil, "-xzf", out, "-C", dir); err != nil {
				t.Fatal(err)
			}
			if !sameFiles(t, raw, filepath.Join(dir, "disk.raw")) {
				t.Error("disk.raw differs from the raw disk")
			}
			if st, _ := os.Stat(out); st.Size() > 1<<20 {
				t.Errorf("archive of %d bytes, want the sparse disk's few", st.Size())
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			needTools(t, tt.tools...)
			f, err := FormatByName(tt.format)
			if err != nil {
				t.Fatal(err)
			}
			var outs []string
			for i := range 2 {
				if i > 0 {
					time.Sleep(1100 * time.Millisecond)
				}
				out := filepath.Join(t.TempDir(), "disk."+tt.format)
				if err := f.Convert(ctx, raw, out); err != nil {
					t.Fatal(err)
				}
				outs = append(outs, out)
			}
			tt.check(t, outs[0])
			if !sameFiles(t, outs[0], outs[1]) {
				t.Error("two conversions of the same disk differ")
			}
			if _, err := os.Stat(raw); err != nil {
				t.Errorf("raw disk gone after Convert: %v", err)
			}
		})
	}
}

// sparseRaw writes a 64 MiB sparse file with a little data at a few
// offsets and returns its path.
func sparseRaw(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.raw")
	if err := createSparse(path, 64<<20); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, off := range []int64{0, 1<<20 + 100, 40 << 20, 64<<20 - 512} {
		if _, err := f.WriteAt([]byte(strings.Repeat("cairn", i+1)), off); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// checkImage checks with qemu-img info that the image at path is one of
// format, of size bytes.
func checkImage(t *testing.T, path, format string, size int64) {
	t.Helper()
	// A fixed VHD has its footer only at its end, where qemu-img does not
	// probe: the format is named.
	out, _, err := qemuImg.run(context.Background(), nil, "info", "-f", format, "--output=json", path)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info.Format != format || info.VirtualSize != size {
		t.Errorf("qemu-img info: format %s, %d bytes; want %s, %d", info.Format, info.VirtualSize, format, size)
	}
}
