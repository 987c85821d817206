package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFormats(t *testing.T) {
	if diff := cmp.Diff([]string{"qcow2", "raw"}, Formats()); diff != "" {
		t.Errorf("Formats() (-want +got):\n%s", diff)
	}
	for _, name := range Formats() {
		f, err := FormatByName(name)
		if err != nil || f.Name() != name {
			t.Errorf("FormatByName(%q) = %v, %v", name, f, err)
		}
	}
	_, err := FormatByName("vmdk")
	if want := `unknown image format "vmdk": valid formats are qcow2, raw`; err == nil || err.Error() != want {
		t.Errorf("FormatByName(vmdk) error %v, want %q", err, want)
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
