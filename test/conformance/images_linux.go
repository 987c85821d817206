package conformance

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"image"
	"image/jpeg"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cairn-os/cairn/test/registry"
)

// epoch stamps every file and image config, so the same inputs make the
// same digest.
var epoch = time.Unix(0, 0).UTC()

// entry is a file, directory or symlink of an image layer.
type entry struct {
	name string // relative to /, such as bin/sh
	mode int64
	data []byte // a regular file's
	link string // a symlink's target
	dir  bool
}

// builders make the images that this package can build, by the name the
// suite gives them (the reference's last path element without the tag);
// the suite's other images are not built and their specs fail to pull.
var builders = map[string]func(ctx context.Context, b bins) (v1.Image, error){
	"agnhost":           agnhostImage,
	"busybox":           busyboxImage,
	"glibc-dns-testing": glibcDNSTestingImage,
	"kitten":            kittenImage,
	"nonroot":           nonrootImage,
	"nonewprivs":        nonewprivsImage,
}

// bins is the directory of the files that go into the images, which
// hack/build-conformance.sh writes.
type bins string

// read returns the file name of b.
func (b bins) read(name string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(string(b), name))
	if err != nil {
		return nil, fmt.Errorf("%w: run make conformance-suite", err)
	}
	return data, nil
}

// pushImages builds each image of refs (as the suite lists them, under
// pull, the registry's address as the nodes name it) that this package
// can build and pushes it to reg, and returns those it could not build.
// The pause image is the node's own (rootfs/pause), which the sandbox
// runs too.
func pushImages(ctx context.Context, reg *registry.Registry, pull string, b bins, refs []string) (missing []string, err error) {
	for _, ref := range refs {
		repoTag, ok := strings.CutPrefix(ref, pull+"/")
		if !ok {
			missing = append(missing, ref)
			continue
		}
		repo, _, _ := strings.Cut(repoTag, ":")
		if path.Base(repo) == "pause" {
			if _, err := registry.BuildAndPush(ctx, reg, "./rootfs/pause", repoTag); err != nil {
				return nil, err
			}
			continue
		}
		build := builders[path.Base(repo)]
		if build == nil {
			missing = append(missing, ref)
			continue
		}
		img, err := build(ctx, b)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", ref, err)
		}
		if _, err := registry.Push(ctx, reg, img, repoTag); err != nil {
			return nil, err
		}
	}
	return missing, nil
}

// busyboxImage is busybox with a link in /bin for each applet, as the
// upstream image has them (specs run /bin/sysctl), and a shell as its
// command.
func busyboxImage(ctx context.Context, b bins) (v1.Image, error) {
	es, err := busyboxEntries(ctx, b, true)
	if err != nil {
		return nil, err
	}
	return imageOf(es, nil, []string{"sh"})
}

// nonrootImage is busybox run as user 1234 by default, as upstream's
// nonroot image is.
func nonrootImage(ctx context.Context, b bins) (v1.Image, error) {
	img, err := busyboxImage(ctx, b)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Config.User = "1234"
	return mutate.ConfigFile(img, cfg)
}

// nonewprivsImage is busybox with nnp, set-user-ID root, as its command:
// it prints the effective user ID, which no_new_privs keeps the caller's.
func nonewprivsImage(ctx context.Context, b bins) (v1.Image, error) {
	es, err := busyboxEntries(ctx, b, true)
	if err != nil {
		return nil, err
	}
	nnp, err := b.read("nnp")
	if err != nil {
		return nil, err
	}
	es = append(es,
		entry{name: "usr/local", mode: 0o755, dir: true},
		entry{name: "usr/local/bin", mode: 0o755, dir: true},
		entry{name: "usr/local/bin/nnp", mode: 0o4755, data: nnp},
	)
	return imageOf(es, nil, []string{"nnp"})
}

// agnhostImage is agnhost at /agnhost (its entrypoint, pause its default
// command) on top of busybox, for the specs that run a shell, nc or wget in
// it, with the user and group that upstream's image defines and porter's
// test certificate at /localhost.crt and /localhost.key.
func agnhostImage(ctx context.Context, b bins) (v1.Image, error) {
	es, err := agnhostEntries(ctx, b)
	if err != nil {
		return nil, err
	}
	return imageOf(es, []string{"/agnhost"}, []string{"pause"})
}

// kittenImage is agnhost's with a picture, as upstream's kitten: /data.json
// naming /kitten.jpg, which agnhost's test-webserver (its command) serves.
// Its /etc/os-release names Alpine Linux, upstream's base, which this one
// stands in for: the ImageVolume spec reads it there.
func kittenImage(ctx context.Context, b bins) (v1.Image, error) {
	es, err := agnhostEntries(ctx, b)
	if err != nil {
		return nil, err
	}
	var jpg bytes.Buffer
	if err := jpeg.Encode(&jpg, image.NewGray(image.Rect(0, 0, 16, 16)), nil); err != nil {
		return nil, fmt.Errorf("kitten.jpg: %w", err)
	}
	es = append(es,
		entry{name: "kitten.jpg", mode: 0o644, data: jpg.Bytes()},
		entry{name: "data.json", mode: 0o644, data: []byte(`{"picture": "kitten.jpg"}` + "\n")},
		entry{name: "etc/os-release", mode: 0o644, data: []byte("NAME=\"cairn-test (stands in for Alpine Linux)\"\nID=cairn-test\n" +
			"PRETTY_NAME=\"busybox and agnhost, built by Cairn's test/conformance in place of upstream's image on Alpine Linux\"\n")},
	)
	return imageOf(es, []string{"/agnhost"}, []string{"test-webserver"})
}

// agnhostEntries are the files of agnhost's image.
func agnhostEntries(ctx context.Context, b bins) ([]entry, error) {
	es, err := busyboxEntries(ctx, b, false)
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		mode int64
	}{{"agnhost", 0o755}, {"localhost.crt", 0o644}, {"localhost.key", 0o644}} {
		data, err := b.read(f.name)
		if err != nil {
			return nil, err
		}
		es = append(es, entry{name: f.name, mode: f.mode, data: data})
	}
	es = append(es,
		entry{name: "agnhost-2", link: "agnhost"},
		entry{name: "uploads", mode: 0o755, dir: true},
	)
	bash, err := os.ReadFile(BashStatic)
	if err != nil {
		return nil, fmt.Errorf("%w: install the Debian package bash-static (hack/deps.sh)", err)
	}
	curl, err := hostProgram(ctx, Curl, "usr/bin/curl")
	if err != nil {
		return nil, err
	}
	// bash replaces busybox's link: specs run /bin/bash.
	es = slices.DeleteFunc(es, func(e entry) bool {
		return e.name == "bin/bash" || e.name == "usr/bin/curl" || e.name == "usr/bin/nc" || e.name == "bin/nc"
	})
	es = append(es, entry{name: "bin/bash", mode: 0o755, data: bash})
	es = append(es, curl...)
	// OpenBSD's netcat, as upstream's image has it: the Service specs run
	// nc -v -t, nc -u and nc -z, which busybox's nc lacks. The DNS specs'
	// queriers run dig and getent (musl's upstream, glibc's here, which
	// reads nsswitch.conf).
	for _, p := range []struct{ path, name string }{{NetcatOpenBSD, "usr/bin/nc"}, {Dig, "usr/bin/dig"}, {Getent, "usr/bin/getent"}} {
		pe, err := hostProgram(ctx, p.path, p.name)
		if err != nil {
			return nil, err
		}
		es = appendNew(es, pe)
	}
	es = append(es, nsswitch)
	for i := range es {
		switch es[i].name {
		case "etc/passwd":
			es[i].data = append(es[i].data, "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"...)
		case "etc/group":
			es[i].data = append(es[i].data, "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"...)
		}
	}
	return es, nil
}

// glibcDNSTestingImage is a glibc root, as upstream's Debian one, for the
// specs that ask glibc's resolver: the host's dash as /bin/sh, Debian's
// hostname (whose -f looks the name up through NSS) and getent, with the
// libraries they link, an nsswitch.conf that reads /etc/hosts before
// DNS, and busybox for the other tools (cat, ls…).
func glibcDNSTestingImage(ctx context.Context, b bins) (v1.Image, error) {
	es, err := busyboxEntries(ctx, b, true)
	if err != nil {
		return nil, err
	}
	progs := []struct{ path, name string }{{Dash, "bin/sh"}, {Hostname, "bin/hostname"}, {Getent, "usr/bin/getent"}, {Dig, "usr/bin/dig"}}
	for _, p := range progs {
		es = slices.DeleteFunc(es, func(e entry) bool { return e.name == p.name })
	}
	for _, p := range progs {
		pe, err := hostProgram(ctx, p.path, p.name)
		if err != nil {
			return nil, err
		}
		es = appendNew(es, pe)
	}
	es = append(es, nsswitch)
	return imageOf(es, nil, []string{"sh"})
}

// nsswitch has glibc's programs read /etc/hosts before DNS, as musl does.
var nsswitch = entry{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("passwd: files\ngroup: files\nhosts: files dns\n")}

// appendNew appends to es the entries of add that es has no file of: the
// programs share libc, the loader and their directories.
func appendNew(es, add []entry) []entry {
	for _, e := range add {
		if !slices.ContainsFunc(es, func(o entry) bool { return o.name == e.name }) {
			es = append(es, e)
		}
	}
	return es
}

// Programs of the host that glibc-dns-testing's image has, from Debian's
// essential packages dash, hostname and libc-bin; and dig, which both
// DNS querier images have, from Debian's bind9-dnsutils.
const (
	Dash     = "/bin/dash"
	Hostname = "/bin/hostname"
	Getent   = "/usr/bin/getent"
	Dig      = "/usr/bin/dig"
)

// Programs of the host that agnhost's image has, as upstream's has them
// from Alpine: bash from Debian's bash-static, curl from Debian's curl with
// the libraries it links (hack/deps.sh installs both).
const (
	BashStatic = "/bin/bash-static"
	Curl       = "/usr/bin/curl"
	// NetcatOpenBSD is Debian's netcat-openbsd.
	NetcatOpenBSD = "/bin/nc.openbsd"
)

// hostProgram is the dynamically linked program at path as the file name
// of an image, with the shared libraries and loader that ldd says it
// needs, each at the path ldd names, and the directories that hold them.
func hostProgram(ctx context.Context, path, name string) ([]entry, error) {
	bin, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: install it (hack/deps.sh)", err)
	}
	out, err := exec.CommandContext(ctx, "ldd", path).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", path, err)
	}
	es := []entry{{name: name, mode: 0o755, data: bin}}
	dirs := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x…)"; linux-vdso has no file.
		f := strings.Fields(l)
		var lib string
		switch {
		case len(f) >= 3 && f[1] == "=>":
			lib = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			lib = f[0]
		default:
			continue
		}
		data, err := os.ReadFile(lib) // through the symlink: the library itself
		if err != nil {
			return nil, fmt.Errorf("%s needs %s: %w", path, lib, err)
		}
		rel := strings.TrimPrefix(lib, "/")
		for d := filepath.Dir(rel); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
		es = append(es, entry{name: rel, mode: 0o755, data: data})
	}
	var ds []entry
	for _, d := range slices.Sorted(maps.Keys(dirs)) { // parents before children
		ds = append(ds, entry{name: d, mode: 0o755, dir: true})
	}
	return append(ds, es...), nil
}

// busyboxEntries are the files of a busybox root: b's busybox
// (hack/build-busybox.sh: Debian's, with an ash that keeps every
// environment variable, as upstream's does), a link per
// applet (all in /bin if flat, as in the busybox image, or else where
// busybox --list-full puts them, as in Alpine's, agnhost's base),
// /etc/passwd and /etc/group with root and nobody, and /tmp.
func busyboxEntries(ctx context.Context, b bins, flat bool) ([]entry, error) {
	bin, err := b.read("busybox")
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(string(b), "busybox"), "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	es := []entry{
		{name: "bin", mode: 0o755, dir: true},
		{name: "sbin", mode: 0o755, dir: true},
		{name: "usr", mode: 0o755, dir: true},
		{name: "usr/bin", mode: 0o755, dir: true},
		{name: "usr/sbin", mode: 0o755, dir: true},
		{name: "etc", mode: 0o755, dir: true},
		{name: "root", mode: 0o700, dir: true},
		{name: "home", mode: 0o755, dir: true},
		{name: "var", mode: 0o755, dir: true},
		{name: "tmp", mode: 0o1777, dir: true},
		{name: "bin/busybox", mode: 0o755, data: bin},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnobody:x:65534:\n")},
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" {
			continue
		}
		if flat {
			name = "bin/" + path.Base(name)
		}
		if name == "bin/busybox" || slices.ContainsFunc(es, func(e entry) bool { return e.name == name }) {
			continue
		}
		es = append(es, entry{name: name, link: "/bin/busybox"})
	}
	return es, sc.Err()
}

// imageOf is a linux/amd64 image of one layer holding es, root-owned.
func imageOf(es []entry, entrypoint, cmd []string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, e.name+"/"
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Created = v1.Time{Time: epoch}
	for i := range cfg.History {
		cfg.History[i].Created = v1.Time{Time: epoch}
		cfg.History[i].CreatedBy = "cairn: test/conformance"
	}
	cfg.Config.Entrypoint, cfg.Config.Cmd = entrypoint, cmd
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return mutate.ConfigFile(img, cfg)
}
