package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/need"

	"github.com/google/go-cmp/cmp"
)

// kernelOnce fetches the real kernel once per test binary into the
// default cache, which is kept between runs.
var kernelOnce = sync.OnceValues(func() (*Kernel, error) {
	return FetchKernel(context.Background(), DefaultCacheDir(), func(string) {})
})

// testKernel returns the pinned Debian kernel, downloading it on first use.
// It skips the test on hosts without apt-get.
func testKernel(t *testing.T) *Kernel {
	t.Helper()
	need.Tool(t, "apt-get", "apt")
	k, err := kernelOnce()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestDefaultCacheDir(t *testing.T) {
	tests := []struct {
		name             string
		cairn, xdg, home string
		want             string
	}{
		{name: "CAIRN_CACHE", cairn: "/c", xdg: "/x", home: "/h", want: "/c"},
		{name: "XDG_CACHE_HOME", xdg: "/x", home: "/h", want: "/x/cairn"},
		{name: "HOME", home: "/h", want: "/h/.cache/cairn"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CAIRN_CACHE", tt.cairn)
			t.Setenv("XDG_CACHE_HOME", tt.xdg)
			t.Setenv("HOME", tt.home)
			if got := DefaultCacheDir(); got != tt.want {
				t.Errorf("DefaultCacheDir() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDebSize(t *testing.T) {
	tests := []struct {
		name      string
		show      string
		wantSize  int64
		wantFound bool
	}{
		{
			name:      "pinned version",
			show:      "Package: " + KernelPackage + "\nVersion: " + KernelVersion + "\nSize: 70591024\n",
			wantSize:  70591024,
			wantFound: true,
		},
		{name: "other version", show: "Package: " + KernelPackage + "\nVersion: 1.0\nSize: 5\n", wantSize: 5},
		{name: "nothing", show: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			size, found := debSize([]byte(tt.show))
			if size != tt.wantSize || found != tt.wantFound {
				t.Errorf("debSize() = %d, %v; want %d, %v", size, found, tt.wantSize, tt.wantFound)
			}
		})
	}
}

func TestLookToolMissing(t *testing.T) {
	_, err := lookTool("cairn-no-such-tool", "cairn-pkg")
	want := "cairn-no-such-tool not found: install the Debian package cairn-pkg (apt-get install cairn-pkg)"
	if err == nil || err.Error() != want {
		t.Errorf("lookTool() error = %v, want %q", err, want)
	}
}

func TestFetchKernel(t *testing.T) {
	first := testKernel(t)

	start := time.Now()
	var lines []string
	k, err := FetchKernel(context.Background(), DefaultCacheDir(), func(s string) { lines = append(lines, s) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("warm FetchKernel: %v", time.Since(start))
	if diff := cmp.Diff(first, k); diff != "" {
		t.Errorf("second FetchKernel differs (-first +second):\n%s", diff)
	}
	if len(lines) != 0 {
		t.Errorf("warm FetchKernel reported progress %q, want none", lines)
	}

	cache := DefaultCacheDir()
	want := &Kernel{
		Release:   KernelRelease,
		Root:      filepath.Join(cache, KernelRelease),
		Vmlinuz:   filepath.Join(cache, KernelRelease, "boot", "vmlinuz-"+KernelRelease),
		Deb:       filepath.Join(cache, KernelPackage+"_"+KernelVersion+"_amd64.deb"),
		DebSHA256: k.DebSHA256,
	}
	if diff := cmp.Diff(want, k); diff != "" {
		t.Errorf("FetchKernel() mismatch (-want +got):\n%s", diff)
	}
	if sum, err := sha256File(k.Deb); err != nil || sum != k.DebSHA256 {
		t.Errorf("sha256 of %s = %s, %v; Kernel says %s", k.Deb, sum, err, k.DebSHA256)
	}
	for _, f := range []string{k.Vmlinuz, filepath.Join(k.ModulesDir(), "modules.dep")} {
		if _, err := os.Stat(f); err != nil {
			t.Error(err)
		}
	}
}
