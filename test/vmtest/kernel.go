package vmtest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/cairn-os/cairn/rootfs"
)

// vmlinux returns the uncompressed kernel of the bzImage k.Vmlinuz,
// extracted once into the cache. QEMU boots it through its PVH entry
// (Debian's kernels have CONFIG_PVH): the same kernel, without the
// decompression that takes 6 to 10 s of a VM test under TCG.
func vmlinux(xz string, k *rootfs.Kernel) (string, error) {
	out := filepath.Join(rootfs.DefaultCacheDir(), "vmtest", "vmlinux-"+k.Release)
	if _, err := os.Stat(out); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return out, err
	}
	bz, err := os.ReadFile(k.Vmlinuz)
	if err != nil {
		return "", err
	}
	payload, err := bzPayload(bz)
	if err != nil {
		return "", fmt.Errorf("%s: %w", k.Vmlinuz, err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".vmlinux-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	// The payload ends with the kernel's size after the xz stream.
	cmd := exec.Command(xz, "--decompress", "--stdout", "--single-stream")
	cmd.Stdin, cmd.Stdout = bytes.NewReader(payload), tmp
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("decompress %s: %w: %s", k.Vmlinuz, err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := tmp.Chmod(0o644); err != nil {
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return out, os.Rename(tmp.Name(), out)
}

// bzPayload returns the compressed kernel inside a bzImage, as its setup
// header (Documentation/arch/x86/boot.rst) locates it; it must be xz.
func bzPayload(bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage")
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	start := (setupSects+1)*512 + int(binary.LittleEndian.Uint32(bz[0x248:]))
	end := start + int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if end > len(bz) {
		return nil, errors.New("bzImage payload out of bounds")
	}
	if p := bz[start:end]; bytes.HasPrefix(p, []byte("\xfd7zXZ\x00")) {
		return p, nil
	}
	return nil, errors.New("bzImage payload is not xz (CONFIG_KERNEL_XZ)")
}
