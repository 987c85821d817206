package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/test/need"

	"github.com/google/go-cmp/cmp"
	"github.com/u-root/u-root/pkg/cpio"
)

const testEpoch = 1700000000 // 2023-11-14 22:13:20 UTC

var (
	testBootModules   = []string{"loop", "squashfs", "overlay"}
	testSystemModules = []string{"virtio_blk", "virtio_net", "ext4", "vfat", "unix"} // unix is built in
)

// testSpec writes small fake inputs into a temporary directory, with
// restrictive modes that Build must not copy.
func testSpec(t *testing.T, k *Kernel) Spec {
	t.Helper()
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return Spec{
		Kernel:          k,
		Stage1:          write("stage1", "\x7fELF fake stage1\n"),
		Node:            write("init", "\x7fELF fake node binary\n"),
		Components:      fakeComponents(t, ""),
		OSRelease:       []byte("ID=cairn\nNAME=Cairn\n"),
		CABundle:        write("ca.pem", "-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"),
		SandboxImage:    write("pause.tar", "fake image archive\n"),
		BootModules:     testBootModules,
		SystemModules:   testSystemModules,
		SourceDateEpoch: testEpoch,
	}
}

// fakeComponents writes small fake component binaries, with restrictive
// modes, into a new directory laid out as `make components` does, all but
// the one named skip, and returns the directory.
func fakeComponents(t *testing.T, skip string) string {
	t.Helper()
	dir := t.TempDir()
	for _, c := range Components {
		if c.Name == skip {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(c.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("\x7fELF fake "+c.Name+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// parents returns the directories above name, without ".".
func parents(name string) []string {
	var dirs []string
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		dirs = append(dirs, d)
	}
	return dirs
}

func TestBuild(t *testing.T) {
	k := testKernel(t)
	spec := testSpec(t, k)
	start := time.Now()
	var lines []string
	res, err := Build(context.Background(), spec, t.TempDir(), func(s string) { lines = append(lines, s) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Build: %v, progress %q", time.Since(start), lines)
	for _, p := range []string{res.SquashFS, res.Initramfs} {
		if st, err := os.Stat(p); err == nil {
			t.Logf("%s: %d bytes", filepath.Base(p), st.Size())
		}
	}

	boot, err := ResolveModules(k.ModulesDir(), testBootModules)
	if err != nil {
		t.Fatal(err)
	}
	system, err := ResolveModules(k.ModulesDir(), testSystemModules)
	if err != nil {
		t.Fatal(err)
	}
	checkLoadOrder(t, k.ModulesDir(), boot)
	checkLoadOrder(t, k.ModulesDir(), system)
	modDir := "lib/modules/" + k.Release
	moduleList := func(mods []string) string {
		if len(mods) == 0 {
			return ""
		}
		return strings.Join(mods, "\n") + "\n"
	}

	t.Run("squashfs", func(t *testing.T) {
		files := map[string]string{ // name -> mode
			"sbin/init":                         "-rwxr-xr-x",
			"usr/bin/cairn-agent":               "-rwxr-xr-x",
			"usr/bin/containerd":                "-rwxr-xr-x",
			"etc/os-release":                    "-rw-r--r--",
			"etc/ssl/certs/ca-certificates.crt": "-rw-r--r--",
			"usr/share/cairn/images/pause.tar":  "-rw-r--r--",
			modDir + "/" + layout.ModuleList:    "-rw-r--r--",
		}
		for _, mod := range slices.Concat(boot, system) {
			files[modDir+"/"+mod] = "-rw-r--r--"
		}
		for _, p := range []string{
			"usr/bin/containerd-shim-runc-v2", "usr/bin/runc",
			"opt/cni/bin/bridge", "opt/cni/bin/host-local", "opt/cni/bin/loopback", "opt/cni/bin/portmap",
		} {
			files[p] = "-rwxr-xr-x"
		}
		dirs := map[string]bool{"": true}
		for _, d := range emptyDirs {
			dirs[d] = true
			for _, p := range parents(d) {
				dirs[p] = true
			}
		}
		for f := range files {
			for _, p := range parents(f) {
				dirs[p] = true
			}
		}
		date := time.Unix(testEpoch, 0).UTC().Format("2006-01-02 15:04")
		var want []string
		for f, mode := range files {
			want = append(want, mode+" 0/0 "+date+" squashfs-root/"+f)
		}
		for d := range dirs {
			want = append(want, strings.TrimSuffix("drwxr-xr-x 0/0 "+date+" squashfs-root/"+d, "/"))
		}
		slices.Sort(want)

		cmd := exec.Command("unsquashfs", "-lln", res.SquashFS)
		cmd.Env = append(os.Environ(), "TZ=UTC")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("unsquashfs -lln: %v", err)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line) // mode owner size date time name
			if len(f) != 6 {
				t.Fatalf("unexpected unsquashfs line %q", line)
			}
			got = append(got, strings.Join([]string{f[0], f[1], f[3], f[4], f[5]}, " "))
		}
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("squashfs listing mismatch (-want +got):\n%s", diff)
		}

		// The node binary's three names are one inode: unsquashfs
		// extracts them as hard links.
		tree := filepath.Join(t.TempDir(), "tree")
		if out, err := exec.Command("unsquashfs", "-d", tree, res.SquashFS).CombinedOutput(); err != nil {
			t.Fatalf("unsquashfs: %v\n%s", err, out)
		}
		initInfo, err := os.Stat(filepath.Join(tree, "sbin/init"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"usr/bin/cairn-agent", "usr/bin/containerd"} {
			st, err := os.Stat(filepath.Join(tree, name))
			if err != nil {
				t.Fatal(err)
			}
			if !os.SameFile(initInfo, st) {
				t.Errorf("%s is not a hard link to sbin/init", name)
			}
		}

		for name, want := range map[string]string{
			"sbin/init":                      readFile(t, spec.Node),
			"usr/bin/cairn-agent":            readFile(t, spec.Node),
			"usr/bin/containerd":             readFile(t, spec.Node),
			"etc/os-release":                 string(spec.OSRelease),
			modDir + "/" + layout.ModuleList: moduleList(system),
			"usr/bin/runc":                   readFile(t, filepath.Join(spec.Components, "runc")),
			"opt/cni/bin/host-local":         readFile(t, filepath.Join(spec.Components, "cni", "host-local")),
		} {
			got, err := exec.Command("unsquashfs", "-cat", res.SquashFS, name).Output()
			if err != nil {
				t.Fatalf("unsquashfs -cat %s: %v", name, err)
			}
			if diff := cmp.Diff(want, string(got)); diff != "" {
				t.Errorf("%s mismatch (-want +got):\n%s", name, diff)
			}
		}
	})

	t.Run("initramfs", func(t *testing.T) {
		type rec struct {
			Name                   string
			Mode                   uint64
			UID, GID, MTime, NLink uint64
			Rmajor, Rminor         uint64
		}
		wantContents := map[string]string{
			"init":                           readFile(t, spec.Stage1),
			"rootfs.sqsh":                    readFile(t, res.SquashFS),
			modDir + "/" + layout.ModuleList: moduleList(boot),
		}
		want := []rec{
			{Name: "dev/console", Mode: cpio.S_IFCHR | 0o600, Rmajor: 5, Rminor: 1},
			{Name: "init", Mode: cpio.S_IFREG | 0o755},
			{Name: "rootfs.sqsh", Mode: cpio.S_IFREG | 0o644},
			{Name: modDir + "/" + layout.ModuleList, Mode: cpio.S_IFREG | 0o644},
		}
		dirs := map[string]bool{"dev": true, "proc": true, "sys": true, "newroot": true}
		for _, mod := range boot {
			want = append(want, rec{Name: modDir + "/" + mod, Mode: cpio.S_IFREG | 0o644})
			wantContents[modDir+"/"+mod] = readFile(t, filepath.Join(k.ModulesDir(), mod))
			for _, p := range parents(mod) {
				dirs[modDir+"/"+p] = true
			}
		}
		for _, p := range parents(modDir + "/x") {
			dirs[p] = true
		}
		for d := range dirs {
			want = append(want, rec{Name: d, Mode: cpio.S_IFDIR | 0o755, NLink: 1})
		}
		for i := range want {
			want[i].MTime = testEpoch
			want[i].NLink++
		}
		slices.SortFunc(want, func(a, b rec) int { return strings.Compare(a.Name, b.Name) })

		f, err := os.Open(res.Initramfs)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		records, err := cpio.ReadAllRecords(cpio.Newc.Reader(f))
		if err != nil {
			t.Fatal(err)
		}
		var got []rec
		for i, r := range records {
			got = append(got, rec{r.Name, r.Mode, r.UID, r.GID, r.MTime, r.NLink, r.Rmajor, r.Rminor})
			if r.Ino != uint64(i+1) {
				t.Errorf("%s: inode %d, want %d", r.Name, r.Ino, i+1)
			}
			if want, ok := wantContents[r.Name]; ok {
				data, err := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
				if err != nil {
					t.Fatal(err)
				}
				if string(data) != want {
					t.Errorf("%s: contents differ (%d bytes, want %d)", r.Name, len(data), len(want))
				}
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("initramfs records mismatch (-want +got):\n%s", diff)
		}
		if data := readFile(t, res.Initramfs); !strings.Contains(data[len(data)-512:], cpio.Trailer) {
			t.Error("initramfs does not end with the trailer")
		}
	})
}

func TestBuildReproducible(t *testing.T) {
	k := testKernel(t)
	spec := testSpec(t, k)
	first, err := Build(context.Background(), spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}

	// Build again elsewhere, later, from inputs with other timestamps and
	// under another umask, and once more over the first build's outputs.
	inputs := []string{spec.Node, spec.CABundle}
	for _, c := range Components {
		inputs = append(inputs, filepath.Join(spec.Components, c.Name))
	}
	for _, f := range inputs {
		later := time.Now().Add(time.Hour)
		if err := os.Chtimes(f, later, later); err != nil {
			t.Fatal(err)
		}
	}
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })
	second, err := Build(context.Background(), spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	third, err := Build(context.Background(), spec, filepath.Dir(first.SquashFS), nil)
	if err != nil {
		t.Fatal(err)
	}

	for _, res := range []*Result{second, third} {
		if diff := cmp.Diff(hashes(t, first), hashes(t, res)); diff != "" {
			t.Errorf("rebuild differs (-first +rebuild):\n%s", diff)
		}
	}
}

func hashes(t *testing.T, res *Result) []string {
	t.Helper()
	var sums []string
	for _, p := range []string{res.SquashFS, res.Initramfs} {
		sum := sha256.Sum256([]byte(readFile(t, p)))
		sums = append(sums, filepath.Base(p)+" "+hex.EncodeToString(sum[:]))
	}
	return sums
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestBuildErrors uses a fake kernel, so it runs without apt.
func TestBuildErrors(t *testing.T) {
	root := t.TempDir()
	modulesDir := filepath.Join(root, "lib", "modules", "r")
	if err := os.MkdirAll(modulesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(modulesDir, "modules.dep"), []byte(fakeModulesDep), 0o644); err != nil {
		t.Fatal(err)
	}
	k := &Kernel{Release: "r", Root: root}
	valid := testSpec(t, k)
	valid.BootModules = nil
	valid.SystemModules = nil

	tests := []struct {
		name    string
		change  func(*Spec)
		wantErr string
	}{
		{name: "no kernel", change: func(s *Spec) { s.Kernel = nil }, wantErr: "no kernel"},
		{name: "negative epoch", change: func(s *Spec) { s.SourceDateEpoch = -1 }, wantErr: "SourceDateEpoch -1 out of range"},
		{name: "unknown boot module", change: func(s *Spec) { s.BootModules = []string{"nosuch"} }, wantErr: `boot modules: module "nosuch" not found`},
		{name: "unknown system module", change: func(s *Spec) { s.SystemModules = []string{"squashfs", "nosuch"} }, wantErr: `system modules: module "nosuch" not found`},
		{name: "missing node binary", change: func(s *Spec) { s.Node = filepath.Join(root, "nosuch") }, wantErr: "nosuch: no such file"},
		{name: "no components", change: func(s *Spec) { s.Components = "" }, wantErr: "no components directory (the shim, runc, CNI plugins): run make build"},
		{name: "missing runc", change: func(s *Spec) { s.Components = fakeComponents(t, "runc") }, wantErr: "component runc missing from "},
		{name: "missing shim", change: func(s *Spec) { s.Components = fakeComponents(t, "containerd-shim-runc-v2") }, wantErr: "run make build"},
		{name: "missing portmap", change: func(s *Spec) { s.Components = fakeComponents(t, "cni/portmap") }, wantErr: "component cni/portmap missing from "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := valid
			tt.change(&spec)
			_, err := Build(context.Background(), spec, t.TempDir(), nil)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Build() error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestHostToolFiles(t *testing.T) {
	const tool = "/sbin/mke2fs"
	need.File(t, tool, "e2fsprogs")
	files, err := hostToolFiles([]string{tool})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range files {
		got[f.name] = true
		if st, err := os.Lstat(f.src); err != nil || !st.Mode().IsRegular() {
			t.Errorf("%s: source %s is not a regular file (symlinks must be resolved)", f.name, f.src)
		}
	}
	for _, want := range []string{"sbin/mke2fs", "lib/x86_64-linux-gnu/libext2fs.so.2", "lib/x86_64-linux-gnu/libc.so.6", "lib64/ld-linux-x86-64.so.2"} {
		if !got[want] {
			t.Errorf("hostToolFiles(%s) lacks %s; got %v", tool, want, got)
		}
	}
}
