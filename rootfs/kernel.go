// Package rootfs builds the two boot artifacts of a Cairn image: the
// read-only root filesystem (a squashfs holding init, cairn-agent, the CA
// bundle and the kernel modules) and the initramfs that mounts it.
//
// Everything is built without root privileges, loop devices or containers,
// and the outputs are bit-for-bit reproducible for a given Spec. The kernel
// is Debian's packaged kernel, pinned by KernelPackage and KernelVersion.
package rootfs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The kernel pin. Change all three together.
const (
	KernelPackage = "linux-image-6.1.0-57-amd64"
	KernelVersion = "6.1.192-3"      // Debian package version
	KernelRelease = "6.1.0-57-amd64" // uname -r, /lib/modules/<release>
)

// Kernel is an extracted Debian kernel package.
type Kernel struct {
	Release   string // uname -r
	Root      string // directory the package was extracted into
	Vmlinuz   string // Root/boot/vmlinuz-<release>
	Deb       string // the downloaded .deb
	DebSHA256 string // hex SHA-256 of Deb
}

// ModulesDir returns Root/lib/modules/<release>.
func (k *Kernel) ModulesDir() string {
	return filepath.Join(k.Root, "lib", "modules", k.Release)
}

// DefaultCacheDir returns $CAIRN_CACHE if set, else $XDG_CACHE_HOME/cairn,
// else $HOME/.cache/cairn (falling back to the temp dir without a home).
func DefaultCacheDir() string {
	if dir := os.Getenv("CAIRN_CACHE"); dir != "" {
		return dir
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "cairn")
}

// FetchKernel downloads the pinned kernel package into cacheDir with
// apt-get, unless it is already there, and extracts it into
// cacheDir/<release> with a generated modules.dep. Both steps are atomic:
// an interrupted run never leaves something that looks complete.
func FetchKernel(ctx context.Context, cacheDir string, progress func(string)) (*Kernel, error) {
	if progress == nil {
		progress = func(string) {}
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("kernel cache: %w", err)
	}
	deb := filepath.Join(cacheDir, fmt.Sprintf("%s_%s_amd64.deb", KernelPackage, KernelVersion))
	if _, err := os.Stat(deb); errors.Is(err, fs.ErrNotExist) {
		if err := downloadKernel(ctx, deb, progress); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("kernel cache: %w", err)
	}

	root := filepath.Join(cacheDir, KernelRelease)
	if _, err := os.Stat(root); errors.Is(err, fs.ErrNotExist) {
		if err := extractKernel(ctx, deb, root, progress); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("kernel cache: %w", err)
	}

	k := &Kernel{
		Release: KernelRelease,
		Root:    root,
		Vmlinuz: filepath.Join(root, "boot", "vmlinuz-"+KernelRelease),
		Deb:     deb,
	}
	if _, err := os.Stat(k.Vmlinuz); err != nil {
		return nil, fmt.Errorf("kernel %s: %w", KernelPackage, err)
	}
	sum, err := sha256File(deb)
	if err != nil {
		return nil, err
	}
	k.DebSHA256 = sum
	return k, nil
}

// downloadKernel runs apt-get download in a temporary directory next to
// deb and renames the result into place.
func downloadKernel(ctx context.Context, deb string, progress func(string)) error {
	aptGet, err := lookTool("apt-get", "apt")
	if err != nil {
		return err
	}
	aptCache, err := lookTool("apt-cache", "apt")
	if err != nil {
		return err
	}
	pin := KernelPackage + "=" + KernelVersion
	show, err := exec.CommandContext(ctx, aptCache, "show", "--no-all-versions", pin).Output()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	size, found := debSize(show)
	if err != nil || !found {
		return fmt.Errorf("kernel %s is not available from apt: run apt-get update, and if it is still missing update the pin in rootfs/kernel.go", pin)
	}

	progress(fmt.Sprintf("downloading %s %s (%d MB)", KernelPackage, KernelVersion, size>>20))
	tmp, err := os.MkdirTemp(filepath.Dir(deb), ".download-")
	if err != nil {
		return fmt.Errorf("download kernel: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := run(ctx, tmp, aptGet, "download", pin); err != nil {
		return fmt.Errorf("download kernel: %w", err)
	}
	if err := os.Rename(filepath.Join(tmp, filepath.Base(deb)), deb); err != nil {
		return fmt.Errorf("download kernel: %w", err)
	}
	return nil
}

// debSize returns the Size field of apt-cache show output, and whether
// the output describes the pinned version at all.
func debSize(show []byte) (int64, bool) {
	var size int64
	var found bool
	sc := bufio.NewScanner(bytes.NewReader(show))
	for sc.Scan() {
		key, val, _ := strings.Cut(sc.Text(), ": ")
		switch key {
		case "Version":
			found = val == KernelVersion
		case "Size":
			size, _ = strconv.ParseInt(val, 10, 64)
		}
	}
	return size, found
}

// extractKernel unpacks deb into a temporary directory, generates the
// module dependency files and renames the directory to root.
func extractKernel(ctx context.Context, deb, root string, progress func(string)) error {
	dpkgDeb, err := lookTool("dpkg-deb", "dpkg")
	if err != nil {
		return err
	}
	depmod, err := lookTool("depmod", "kmod")
	if err != nil {
		return err
	}
	progress("extracting kernel")
	tmp, err := os.MkdirTemp(filepath.Dir(root), ".extract-")
	if err != nil {
		return fmt.Errorf("extract kernel: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := run(ctx, "", dpkgDeb, "-x", deb, tmp); err != nil {
		return fmt.Errorf("extract %s: %w", deb, err)
	}
	progress("generating module dependencies")
	if err := run(ctx, "", depmod, "-b", tmp, KernelRelease); err != nil {
		return fmt.Errorf("depmod %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, root); err != nil {
		// A concurrent FetchKernel may have finished first.
		if _, statErr := os.Stat(root); statErr == nil {
			return nil
		}
		return fmt.Errorf("extract kernel: %w", err)
	}
	return nil
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// lookTool finds a host tool on PATH or in the sbin directories, which
// are not on an ordinary user's PATH on Debian, and otherwise names the
// Debian package that provides it.
func lookTool(name, debianPackage string) (string, error) {
	if path, err := exec.LookPath(name); err == nil {
		return path, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		path := filepath.Join(dir, name)
		if info, err := os.Stat(path); err == nil && info.Mode()&0o111 != 0 {
			return path, nil
		}
	}
	return "", fmt.Errorf("%s not found: install the Debian package %s (apt-get install %s)", name, debianPackage, debianPackage)
}

// run runs a command in dir and includes its output in the error.
func run(ctx context.Context, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
