package rootfs

import (
	"context"
	"errors"
	"fmt"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/u-root/u-root/pkg/ldd"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Spec describes the root filesystem and initramfs to build.
type Spec struct {
	Kernel *Kernel
	Stage1 string // path of the initramfs's /init (static Go)
	// Node is the path of the node binary (static Go): init, cairn-agent
	// and containerd in one, placed under the three names as hard links,
	// which share its data and its page cache.
	Node          string
	Components    string   // directory of the shim, runc and the CNI plugins, as `make build` lays it out
	OSRelease     []byte   // contents of /etc/os-release
	CABundle      string   // path to a PEM bundle for /etc/ssl/certs/ca-certificates.crt
	BootModules   []string // loaded by init stage 1 from the initramfs (e.g. loop, squashfs, overlay)
	SystemModules []string // loaded by init stage 2 from the squashfs (e.g. virtio_blk, virtio_net, ext4, vfat)
	// SandboxImage is the image archive of the pod sandbox, placed at
	// layout.SandboxArchive.
	SandboxImage string
	// HostTools are dynamically linked programs of the build host (e.g.
	// /sbin/mke2fs) copied to the same paths, with the shared libraries
	// they need.
	HostTools       []string
	SourceDateEpoch int64 // timestamp of every file, seconds since 1970
}

// Result holds the paths of the built artifacts.
type Result struct {
	SquashFS  string // the root filesystem
	Initramfs string // uncompressed newc cpio holding init, boot modules and the squashfs
}

// emptyDirs are the directories of the root filesystem that hold nothing
// but mount points and runtime state.
var emptyDirs = []string{
	"dev", "proc", "sys", "run", "tmp", "var", "root", "usr/lib",
	"etc/cairn", "etc/containerd", "etc/cni/net.d", "system/state", "system/overlay",
}

// A Component is one of the node's container runtime binaries that is a
// program of its own.
type Component struct {
	Name string // path below Spec.Components, slash-separated
	Path string // path in the root filesystem, installed with mode 0755
	Make string // the make target that builds it
}

// Components are the binaries Build takes from Spec.Components: the shim,
// which the main module pins with containerd, and what `make components`
// builds from the module in rootfs/components.
var Components = []Component{
	{"containerd-shim-runc-v2", "usr/bin/containerd-shim-runc-v2", "build"},
	{"runc", "usr/bin/runc", "components"},
	{"cni/bridge", "opt/cni/bin/bridge", "components"},
	{"cni/host-local", "opt/cni/bin/host-local", "components"},
	{"cni/loopback", "opt/cni/bin/loopback", "components"},
	{"cni/portmap", "opt/cni/bin/portmap", "components"},
}

// file is a regular file of the root filesystem or the initramfs.
type file struct {
	name string      // path inside the image, relative to its root
	perm fs.FileMode // permission bits
	src  string      // host file holding the contents, or
	data []byte      // the contents when src is empty, or
	link string      // the file listed before it that this is a hard link to
}

// Build writes rootfs.sqsh and initramfs.cpio into workDir. The outputs
// depend only on spec and the files it names, never on the time, the
// user or the umask. progress, if not nil, receives short status lines.
func Build(ctx context.Context, spec Spec, workDir string, progress func(string)) (*Result, error) {
	if progress == nil {
		progress = func(string) {}
	}
	if spec.Kernel == nil {
		return nil, errors.New("build rootfs: no kernel")
	}
	if spec.SourceDateEpoch < 0 || spec.SourceDateEpoch > math.MaxUint32 {
		return nil, fmt.Errorf("build rootfs: SourceDateEpoch %d out of range", spec.SourceDateEpoch)
	}
	modulesDir := spec.Kernel.ModulesDir()
	boot, err := ResolveModules(modulesDir, spec.BootModules)
	if err != nil {
		return nil, fmt.Errorf("boot modules: %w", err)
	}
	system, err := ResolveModules(modulesDir, spec.SystemModules)
	if err != nil {
		return nil, fmt.Errorf("system modules: %w", err)
	}
	all, err := ResolveModules(modulesDir, slices.Concat(spec.BootModules, spec.SystemModules))
	if err != nil {
		return nil, fmt.Errorf("modules: %w", err)
	}
	components, err := componentFiles(spec.Components)
	if err != nil {
		return nil, fmt.Errorf("build rootfs: %w", err)
	}
	tools, err := hostToolFiles(spec.HostTools)
	if err != nil {
		return nil, fmt.Errorf("build rootfs: %w", err)
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return nil, fmt.Errorf("build rootfs: %w", err)
	}

	res := &Result{
		SquashFS:  filepath.Join(workDir, "rootfs.sqsh"),
		Initramfs: filepath.Join(workDir, "initramfs.cpio"),
	}
	files := slices.Concat([]file{
		{name: rootPath(layout.InitBinary), perm: 0o755, src: spec.Node},
		{name: rootPath(layout.AgentBinary), link: rootPath(layout.InitBinary)},
		{name: rootPath(layout.ContainerdBinary), link: rootPath(layout.InitBinary)},
		{name: "etc/os-release", perm: 0o644, data: spec.OSRelease},
		{name: "etc/ssl/certs/ca-certificates.crt", perm: 0o644, src: spec.CABundle},
		{name: rootPath(layout.SandboxArchive), perm: 0o644, src: spec.SandboxImage},
	}, components, tools, moduleFiles(spec.Kernel, all, system))
	progress(fmt.Sprintf("building root filesystem (%d modules)", len(all)))
	if err := buildSquashFS(ctx, files, emptyDirs, res.SquashFS, spec.SourceDateEpoch, workDir); err != nil {
		return nil, err
	}

	progress(fmt.Sprintf("writing initramfs (%d modules)", len(boot)))
	files = append([]file{
		{name: "init", perm: 0o755, src: spec.Stage1},
		{name: "rootfs.sqsh", perm: 0o644, src: res.SquashFS},
	}, moduleFiles(spec.Kernel, boot, boot)...)
	if err := writeInitramfs(files, res.Initramfs, spec.SourceDateEpoch); err != nil {
		return nil, err
	}
	return res, nil
}

// componentFiles returns the files of the components in dir, checking
// first that each is there.
func componentFiles(dir string) ([]file, error) {
	if dir == "" {
		return nil, errors.New("no components directory (the shim, runc, CNI plugins): run make build")
	}
	var files []file
	for _, c := range Components {
		src := filepath.Join(dir, filepath.FromSlash(c.Name))
		st, err := os.Stat(src)
		if errors.Is(err, fs.ErrNotExist) || err == nil && !st.Mode().IsRegular() {
			return nil, fmt.Errorf("component %s missing from %s: run make %s", c.Name, dir, c.Make)
		}
		if err != nil {
			return nil, fmt.Errorf("component %s: %w", c.Name, err)
		}
		files = append(files, file{name: c.Path, perm: 0o755, src: src})
	}
	return files, nil
}

// hostToolFiles returns the host programs and every shared library they
// load (found by running their ELF interpreter, as ldd does), each at its
// host path. Libraries are copied as files, symlinks resolved.
func hostToolFiles(tools []string) ([]file, error) {
	if len(tools) == 0 {
		return nil, nil
	}
	libs, err := ldd.List(tools...)
	if err != nil {
		return nil, fmt.Errorf("shared libraries of %v: %w", tools, err)
	}
	var files []file
	for _, p := range slices.Concat(tools, libs) {
		src, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, fmt.Errorf("host tool %s: %w", p, err)
		}
		files = append(files, file{name: strings.TrimPrefix(p, "/"), perm: 0o755, src: src})
	}
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.name, b.name) })
	return slices.CompactFunc(files, func(a, b file) bool { return a.name == b.name }), nil
}

// HostToolSources returns the host files that tools bring into the root
// filesystem: the programs and their shared libraries, symlinks resolved.
func HostToolSources(tools []string) ([]string, error) {
	files, err := hostToolFiles(tools)
	if err != nil {
		return nil, err
	}
	srcs := make([]string, len(files))
	for i, f := range files {
		srcs[i] = f.src
	}
	return srcs, nil
}

// moduleFiles returns the files of the modules mods and a module list
// naming load, all under lib/modules/<release>.
func moduleFiles(k *Kernel, mods, load []string) []file {
	dir := path.Join("lib/modules", k.Release)
	var files []file
	for _, mod := range mods {
		files = append(files, file{name: path.Join(dir, mod), perm: 0o644, src: filepath.Join(k.ModulesDir(), mod)})
	}
	var list strings.Builder
	for _, mod := range load {
		list.WriteString(mod + "\n")
	}
	return append(files, file{name: path.Join(dir, layout.ModuleList), perm: 0o644, data: []byte(list.String())})
}

// writeTree creates files and the directories dirs below root with fixed
// permissions: 0755 for every directory, perm for every file.
func writeTree(root string, files []file, dirs []string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	for _, f := range files {
		dst := filepath.Join(root, f.name)
		if f.link == "" {
			if err := writeFile(dst, f); err != nil {
				return err
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Link(filepath.Join(root, f.link), dst); err != nil {
			return err
		}
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return os.Chmod(p, 0o755)
	})
}

func writeFile(dst string, f file) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if f.src == "" {
		_, err = out.Write(f.data)
	} else {
		err = copyFrom(out, f.src)
	}
	if err != nil {
		return err
	}
	if err := out.Chmod(f.perm); err != nil {
		return err
	}
	return out.Close()
}

func copyFrom(w io.Writer, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	_, err = io.Copy(w, in)
	return err
}

// rootPath is the path p of the node's root filesystem relative to its
// root, as the tree lists it.
func rootPath(p string) string { return strings.TrimPrefix(p, "/") }
