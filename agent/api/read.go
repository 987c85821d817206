package api

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/layout"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// readLimit is the most Read sends of a file; readChunk the size of each
// message.
const (
	readLimit = 16 << 20
	readChunk = 32 << 10
)

// readRoots are the trees Read serves files from.
var readRoots = []string{"/var/log", "/proc", "/sys", "/etc"}

// readDenied are the secrets Read refuses, each with why. A pattern that
// starts with "/" is matched (path.Match) against the resolved path and
// each of its parents, so that an entry covers its whole tree; any other
// is matched against the file's name. The entries outside readRoots are
// listed too so that a link to them is refused by name.
var readDenied = []struct{ pattern, reason string }{
	{layout.StateDir, "the STATE partition: the machine config with its keys, the node's identity"},
	{filepath.Join(layout.KubeletDir, "pki"), "the kubelet's client and serving keys"},
	{"/etc/shadow", "password hashes"},
	{"/etc/shadow-", "password hashes"},
	{"/etc/gshadow", "password hashes"},
	{"/etc/gshadow-", "password hashes"},
	{"/etc/ssh", "SSH host keys"},
	{"*.key", "a private key, by its name"},
	{"*-key.pem", "a private key, by its name"},
	{"/proc/*/environ", "a process's environment, which may hold credentials"},
	{"/proc/*/task/*/environ", "a thread's environment, which may hold credentials"},
	{"/proc/*/mem", "a process's memory"},
	{"/proc/*/task/*/mem", "a thread's memory"},
	{"/proc/kcore", "the kernel's memory"},
	{"/proc/kmsg", "reading it takes the records from the kernel log (use dmesg)"},
	{"/sys/firmware/efi/efivars", "EFI variables, which may hold keys"},
	{"/sys/kernel/debug", "debugfs, which exposes kernel memory"},
}

// Read streams a file that is under one of readRoots once every link in
// its path is resolved, and on no deny list entry.
func (s *machineServer) Read(req *machine.ReadRequest, stream grpc.ServerStreamingServer[machine.ReadChunk]) error {
	resolved, err := checkReadable(req.Path)
	if err != nil {
		return err
	}
	// RESOLVE_NO_SYMLINKS: the path opened is the one checked, even if a
	// link was put in it since.
	fd, err := unix.Openat2(unix.AT_FDCWD, resolved, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOCTTY | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS,
	})
	if err != nil {
		return status.Errorf(codes.FailedPrecondition, "open %s: %v", resolved, err)
	}
	f := os.NewFile(uintptr(fd), resolved)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return status.Errorf(codes.Internal, "stat %s: %v", resolved, err)
	}
	if !fi.Mode().IsRegular() {
		return status.Errorf(codes.InvalidArgument, "%s is not a regular file (%s): only files can be read", req.Path, fi.Mode().Type())
	}
	// /var/log shares its filesystem with /var/lib, where the kubelet's
	// keys are: a second name of a file there would pass the checks.
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 && strings.HasPrefix(resolved, "/var/log/") {
		return status.Errorf(codes.PermissionDenied, "%s has %d hard links: under /var/log, only a file of one name is served", req.Path, st.Nlink)
	}
	limit := req.Limit
	if limit <= 0 || limit > readLimit {
		limit = readLimit
	}
	// Files of /proc and /sys have no size: read one byte past the limit
	// to tell a file that ends there from one that goes on.
	r := io.LimitReader(f, limit+1)
	buf := make([]byte, readChunk)
	var sent int64
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			data, truncated := buf[:n], false
			if sent+int64(n) > limit {
				data, truncated = data[:limit-sent], true
			}
			sent += int64(len(data))
			if err := stream.Send(&machine.ReadChunk{Data: data, Truncated: truncated}); err != nil {
				return err
			}
		}
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return nil
		case err != nil:
			return status.Errorf(codes.Internal, "read %s: %v", resolved, err)
		}
	}
}

// checkReadable resolves p's links and tells whether Read may serve it,
// returning the resolved path. Its errors are gRPC statuses that say why.
func checkReadable(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", status.Errorf(codes.InvalidArgument, "%s is not an absolute path", p)
	}
	resolved, err := filepath.EvalSymlinks(filepath.Clean(p))
	if errors.Is(err, fs.ErrNotExist) {
		return "", status.Errorf(codes.NotFound, "%s does not exist", p)
	}
	if err != nil {
		return "", status.Errorf(codes.InvalidArgument, "resolve %s: %v", p, err)
	}
	via := ""
	if resolved != filepath.Clean(p) {
		via = " (through a link, to " + resolved + ")"
	}
	if reason, ok := denied(resolved); ok {
		return "", status.Errorf(codes.PermissionDenied, "%s%s is never served: %s", p, via, reason)
	}
	for _, root := range readRoots {
		if resolved == root || strings.HasPrefix(resolved, root+"/") {
			return resolved, nil
		}
	}
	return "", status.Errorf(codes.PermissionDenied, "%s%s is not under /var/log, /proc, /sys or /etc", p, via)
}

// denied returns the reason of the first readDenied entry that covers p.
func denied(p string) (string, bool) {
	for _, d := range readDenied {
		if !strings.HasPrefix(d.pattern, "/") {
			if ok, _ := path.Match(d.pattern, path.Base(p)); ok {
				return d.reason, true
			}
			continue
		}
		for q := p; q != "/"; q = path.Dir(q) {
			if ok, _ := path.Match(d.pattern, q); ok {
				return d.reason, true
			}
		}
	}
	return "", false
}
