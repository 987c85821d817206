package rootfs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const fakeModulesDep = `kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/netfilter/nf_tables.ko.xz: kernel/net/netfilter/nfnetlink.ko.zst
kernel/net/netfilter/nfnetlink.ko.zst:
kernel/drivers/hid/hid-generic.ko:

kernel/fs/squashfs/squashfs.ko:
`

const fakeModulesBuiltin = `kernel/net/unix/unix.ko
kernel/drivers/char/tpm/tpm-tis.ko
`

// fakeModulesDir writes files into a temporary modules directory.
func fakeModulesDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestResolveModules(t *testing.T) {
	dir := fakeModulesDir(t, map[string]string{"modules.dep": fakeModulesDep, "modules.builtin": fakeModulesBuiltin})
	tests := []struct {
		name    string
		names   []string
		want    []string
		wantErr string
	}{
		{name: "none"},
		{
			name:  "leaf",
			names: []string{"squashfs"},
			want:  []string{"kernel/fs/squashfs/squashfs.ko"},
		},
		{
			name:  "dependencies first",
			names: []string{"virtio_net"},
			want: []string{
				"kernel/net/core/failover.ko",
				"kernel/drivers/net/net_failover.ko",
				"kernel/drivers/virtio/virtio_ring.ko",
				"kernel/drivers/virtio/virtio.ko",
				"kernel/drivers/net/virtio_net.ko",
			},
		},
		{
			name:  "shared dependencies once",
			names: []string{"virtio_blk", "virtio-net", "virtio"},
			want: []string{
				"kernel/drivers/virtio/virtio_ring.ko",
				"kernel/drivers/virtio/virtio.ko",
				"kernel/drivers/block/virtio_blk.ko",
				"kernel/net/core/failover.ko",
				"kernel/drivers/net/net_failover.ko",
				"kernel/drivers/net/virtio_net.ko",
			},
		},
		{
			name:  "dash underscore and compressed",
			names: []string{"nf-tables", "hid_generic"},
			want: []string{
				"kernel/net/netfilter/nfnetlink.ko.zst",
				"kernel/net/netfilter/nf_tables.ko.xz",
				"kernel/drivers/hid/hid-generic.ko",
			},
		},
		{
			name:  "built in skipped",
			names: []string{"unix", "tpm_tis", "squashfs"},
			want:  []string{"kernel/fs/squashfs/squashfs.ko"},
		},
		{
			name:    "unknown",
			names:   []string{"squashfs", "nosuchmod"},
			wantErr: `module "nosuchmod" not found`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResolveModules(dir, tt.names)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ResolveModules(%q) error = %v, want one containing %q", tt.names, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ResolveModules(%q) mismatch (-want +got):\n%s", tt.names, diff)
			}
		})
	}
}

func TestResolveModulesBadInput(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		wantErr string
	}{
		{name: "no modules.dep", wantErr: "modules.dep: no such file"},
		{name: "no colon", files: map[string]string{"modules.dep": "kernel/a.ko\n"}, wantErr: "modules.dep:1: missing ':'"},
		{
			name:    "cycle",
			files:   map[string]string{"modules.dep": "kernel/a.ko: kernel/b.ko\nkernel/b.ko: kernel/a.ko\n"},
			wantErr: "module dependency cycle through kernel/a.ko",
		},
		{
			name:    "duplicate name",
			files:   map[string]string{"modules.dep": "kernel/x/a.ko:\nkernel/y/a.ko:\n"},
			wantErr: "module a is both kernel/x/a.ko and kernel/y/a.ko",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ResolveModules(fakeModulesDir(t, tt.files), []string{"a"})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ResolveModules() error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// checkLoadOrder checks that mods is a valid load order according to the
// kernel's modules.dep: each module once, after all of its dependencies.
func checkLoadOrder(t *testing.T, modulesDir string, mods []string) {
	t.Helper()
	deps, _, err := readModulesDep(filepath.Join(modulesDir, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	for i, mod := range mods {
		if slices.Contains(mods[:i], mod) {
			t.Errorf("%s listed twice", mod)
		}
		for _, dep := range deps[mod] {
			if !slices.Contains(mods[:i], dep) {
				t.Errorf("%s is not loaded before its dependent %s", dep, mod)
			}
		}
	}
}

func TestResolveModulesRealKernel(t *testing.T) {
	k := testKernel(t)
	names := []string{"virtio_net", "squashfs", "overlay", "loop", "ext4", "vfat", "virtio_blk"}
	got, err := ResolveModules(k.ModulesDir(), names)
	if err != nil {
		t.Fatal(err)
	}
	checkLoadOrder(t, k.ModulesDir(), got)
	for _, name := range names {
		if !slices.ContainsFunc(got, func(mod string) bool { return moduleName(filepath.Base(mod)) == name }) {
			t.Errorf("%s missing from %q", name, got)
		}
	}
	for _, dep := range []string{"kernel/drivers/virtio/virtio.ko", "kernel/fs/jbd2/jbd2.ko", "kernel/fs/fat/fat.ko"} {
		if !slices.Contains(got, dep) {
			t.Errorf("dependency %s missing from %q", dep, got)
		}
	}
	t.Logf("resolved %q", got)
}
