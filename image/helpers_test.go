package image

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cairn-os/cairn/test/need"
)

// Host files the tests use, from the Debian package systemd-boot-efi.
const (
	stubPath       = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	bootloaderPath = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
)

// Tools only the tests use.
var (
	objdump  = tool{"objdump", "binutils"}
	sgdisk   = tool{"sgdisk", "gdisk"}
	fsckVfat = tool{"fsck.vfat", "dosfstools"}
	mdir     = tool{"mdir", "mtools"}
	mtype    = tool{"mtype", "mtools"}
	e2fsck   = tool{"e2fsck", "e2fsprogs"}
)

// needTools skips the test unless all tools are installed.
func needTools(t *testing.T, tools ...tool) {
	t.Helper()
	for _, tl := range tools {
		if _, err := tl.path(); err != nil {
			need.Missing(t, "%v", err)
		}
	}
}

// needFile skips the test unless the file at path, from the Debian
// package pkg, exists.
func needFile(t *testing.T, path, pkg string) {
	t.Helper()
	need.File(t, path, pkg)
}

// randomBytes returns n pseudo-random bytes, the same for the same seed.
func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	return b
}

// writeFile writes data to name in dir and returns its path.
func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// diskUsage returns the bytes of storage the file at path occupies.
func diskUsage(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}
