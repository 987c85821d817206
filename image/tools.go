package image

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// tool is a host program and the Debian package that provides it.
type tool struct{ name, pkg string }

var (
	mkfsVfat = tool{"mkfs.vfat", "dosfstools"}
	mmd      = tool{"mmd", "mtools"}
	mcopy    = tool{"mcopy", "mtools"}
	mke2fs   = tool{"mke2fs", "e2fsprogs"}
	debugfs  = tool{"debugfs", "e2fsprogs"}
	qemuImg  = tool{"qemu-img", "qemu-utils"}
	gnuTar   = tool{"tar", "tar"}
	gzipTool = tool{"gzip", "gzip"}
	xorriso  = tool{"xorriso", "xorriso"}
)

// path finds the tool in PATH or in the sbin directories, which Debian
// leaves out of an ordinary user's PATH.
func (t tool) path() (string, error) {
	if p, err := exec.LookPath(t.name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if p, err := exec.LookPath(filepath.Join(dir, t.name)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found: install the Debian package %s", t.name, t.pkg)
}

// run runs the tool with args. The tool gets only the environment in env
// plus TZ=UTC and LC_ALL=C, so that nothing from the caller's environment
// (time zone, locale, tool settings) can change what it writes. It returns
// the tool's standard output and error; on failure the error includes them.
func (t tool) run(ctx context.Context, env []string, args ...string) (stdout, stderr []byte, err error) {
	p, err := t.path()
	if err != nil {
		return nil, nil, err
	}
	var outBuf, errBuf bytes.Buffer
	cmd := exec.CommandContext(ctx, p, args...)
	cmd.Env = append([]string{"TZ=UTC", "LC_ALL=C"}, env...)
	cmd.Stdout, cmd.Stderr = &outBuf, &errBuf
	if err := cmd.Run(); err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w: %s", t.name, strings.Join(args, " "), err,
			bytes.TrimSpace(append(outBuf.Bytes(), errBuf.Bytes()...)))
	}
	return outBuf.Bytes(), errBuf.Bytes(), nil
}
