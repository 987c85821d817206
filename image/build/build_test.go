package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/internal/bootentry"
	"github.com/cairn-os/cairn/internal/version"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/rootfs"
	"github.com/cairn-os/cairn/test/need"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// testSize keeps the disk small: hashing and copying a sparse 2 GiB default
// costs seconds per build.
const testSize = 512 << 20

// machineConfig writes a generated machine config into a new directory and
// returns its path.
func machineConfig(t *testing.T) string {
	t.Helper()
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "build-test"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := b.Write(dir, false); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, machineconfig.MachineConfigFile)
}

// fakeAssets writes small fake node binaries and components into a new
// directory laid out as `make build` lays out its output, all but the one
// named skip, and returns the directory. The build copies them and never
// runs them.
func fakeAssets(t *testing.T, skip string) string {
	t.Helper()
	dir := t.TempDir()
	names := []string{"init-stage1", "init", "pause"}
	for _, c := range rootfs.Components {
		names = append(names, c.Name)
	}
	for _, name := range names {
		if name == skip {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("\x7fELF fake "+name+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// needHostFiles skips the test unless the build host has every Debian
// file the build takes.
func needHostFiles(t *testing.T) {
	t.Helper()
	for _, in := range hostInputs(Options{}) {
		if in.pkg != "" {
			need.File(t, in.path, in.pkg)
		}
	}
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// dirNames returns the names in dir.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// needBuildTools skips the test unless the build host has what a whole
// build runs: apt-get for the pinned kernel (fetched once into the shared
// cache, not per test) and the tools that make the filesystems.
func needBuildTools(t *testing.T) {
	t.Helper()
	for _, tl := range []struct{ name, pkg string }{
		{"apt-get", "apt"}, {"mksquashfs", "squashfs-tools"}, {"mkfs.vfat", "dosfstools"},
		{"mmd", "mtools"}, {"mcopy", "mtools"}, {"mke2fs", "e2fsprogs"}, {"debugfs", "e2fsprogs"},
	} {
		need.Tool(t, tl.name, tl.pkg)
	}
	needHostFiles(t)
}

// TestBuild builds one config twice into different directories and wants
// the same bytes for the disk and the manifest, a manifest that names
// every input and output with the digest of its file, and nothing but the
// disk and the manifest left beside them; a third build at another
// SourceDateEpoch must differ.
func TestBuild(t *testing.T) {
	needBuildTools(t)
	const day = 24 * 60 * 60
	config, assets, cache := machineConfig(t), fakeAssets(t, ""), testCache(t)
	build := func(epoch int64) (string, *image.Manifest) {
		dir := t.TempDir()
		var stages []string
		m, err := Build(context.Background(), Options{
			Config:          config,
			Output:          filepath.Join(dir, "node.raw"),
			Assets:          assets,
			CacheDir:        cache,
			Size:            testSize,
			SourceDateEpoch: epoch,
			Progress:        func(line string) { stages = append(stages, line) },
		})
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		if len(stages) == 0 || !strings.HasSuffix(stages[len(stages)-1], "done: "+filepath.Join(dir, "node.raw")) {
			t.Errorf("Build reported the stages %q, want them to end with done", stages)
		}
		// Each stage but the last is followed by how long it took (lines
		// within a stage have no time).
		timed := slices.DeleteFunc(slices.Clone(stages), func(l string) bool { return !strings.HasPrefix(l, "[") })
		took := regexp.MustCompile(`^\[ *[0-9.]+s\]   (.+) took [0-9.]+[mµn]?s$`)
		for i := 0; i+1 < len(timed); i += 2 {
			if m := took.FindStringSubmatch(timed[i+1]); m == nil || !strings.HasSuffix(timed[i], "] "+m[1]) {
				t.Errorf("stage %q is followed by %q, want how long it took", timed[i], timed[i+1])
			}
		}
		return dir, m
	}
	a, m := build(0)
	b, _ := build(0)
	c, _ := build(DefaultSourceDateEpoch + day)

	if got, want := dirNames(t, a), []string{"manifest.json", "node.raw"}; !cmp.Equal(got, want) {
		t.Errorf("output directory holds %q, want %q", got, want)
	}
	for _, name := range []string{"node.raw", "manifest.json"} {
		if ha, hb := fileSHA(t, filepath.Join(a, name)), fileSHA(t, filepath.Join(b, name)); ha != hb {
			t.Errorf("%s differs between two builds: %s vs %s", name, ha, hb)
		}
	}
	if fileSHA(t, filepath.Join(a, "node.raw")) == fileSHA(t, filepath.Join(c, "node.raw")) {
		t.Errorf("node.raw is the same at SourceDateEpoch %d and %d", DefaultSourceDateEpoch, DefaultSourceDateEpoch+day)
	}
	if st, err := os.Stat(filepath.Join(a, "node.raw")); err != nil || st.Size() != testSize {
		t.Errorf("node.raw: %v, want %d bytes", err, testSize)
	}

	// manifest.json holds what Build returned, sorted by name.
	var written image.Manifest
	if b, err := os.ReadFile(filepath.Join(a, "manifest.json")); err != nil {
		t.Fatal(err)
	} else if err := json.Unmarshal(b, &written); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	byName := cmpopts.SortSlices(func(x, y image.Artifact) bool { return x.Name < y.Name })
	if diff := cmp.Diff(*m, written, byName); diff != "" {
		t.Errorf("manifest.json differs from the manifest Build returned (-returned +written):\n%s", diff)
	}

	wantInputs := []string{"machine-config", "kernel-package", "uki-stub", "bootloader",
		"init-stage1", "init", "pause", "ca-bundle", "sbin/mke2fs", "sbin/e2fsck", "sbin/resize2fs", "sbin/nft"}
	for _, c := range rootfs.Components {
		wantInputs = append(wantInputs, c.Name)
	}
	names := func(as []image.Artifact) []string {
		var n []string
		for _, a := range as {
			n = append(n, a.Name)
		}
		return n
	}
	sorted := cmpopts.SortSlices(func(x, y string) bool { return x < y })
	if diff := cmp.Diff(wantInputs, names(m.Inputs), sorted); diff != "" {
		t.Errorf("manifest inputs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"node.raw", "uki", "initramfs", "rootfs.sqsh"}, names(m.Outputs), sorted); diff != "" {
		t.Errorf("manifest outputs (-want +got):\n%s", diff)
	}
	files := map[string]string{
		"machine-config": config,
		"init":           filepath.Join(assets, "init"),
		"cni/portmap":    filepath.Join(assets, "cni", "portmap"),
		"sbin/nft":       "/sbin/nft",
		"kernel-package": filepath.Join(cache, rootfs.KernelPackage+"_"+rootfs.KernelVersion+"_amd64.deb"),
	}
	for _, art := range slices.Concat(m.Inputs, m.Outputs) {
		if path, ok := files[art.Name]; ok {
			if sum := fileSHA(t, path); art.SHA256 != sum {
				t.Errorf("manifest gives %s the sha256 %s, its file %s has %s", art.Name, art.SHA256, path, sum)
			}
		}
		// The sparse disk has the digest of its blocks
		// (image.TestDiskArtifact checks it against every byte).
		if art.Name == "node.raw" {
			want, err := image.DiskArtifact(context.Background(), "node.raw", filepath.Join(a, "node.raw"))
			if err != nil {
				t.Fatal(err)
			}
			if art != want {
				t.Errorf("manifest gives node.raw %+v, its file has %+v", art, want)
			}
		}
	}
	// --uki: the UKI alone, the very bytes the disk's build made.
	t.Run("UKI", func(t *testing.T) {
		dir := t.TempDir()
		out := filepath.Join(dir, "node.efi")
		um, err := Build(context.Background(), Options{Config: config, Output: out, Assets: assets, CacheDir: cache, UKI: true})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := dirNames(t, dir), []string{"manifest.json", "node.efi"}; !cmp.Equal(got, want) {
			t.Errorf("output directory holds %q, want %q", got, want)
		}
		var diskUKI string
		for _, a := range m.Outputs {
			if a.Name == "uki" {
				diskUKI = a.SHA256
			}
		}
		if sum := fileSHA(t, out); sum != diskUKI || len(um.Outputs) == 0 || um.Outputs[0].SHA256 != sum {
			t.Errorf("--uki wrote a UKI of sha256 %s (manifest %v), the disk's build one of %s", sum, um.Outputs, diskUKI)
		}
		f, err := os.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if info, err := bootentry.ReadUKI(f); err != nil || info.Version != version.Version {
			t.Errorf("ReadUKI(%s) = %+v, %v; want version %s", out, info, err, version.Version)
		}
	})
}

// TestBuildErrors wants a build that cannot succeed to stop before it
// writes anything, the kernel cache included, with an error that names
// what is wrong and what to do.
func TestBuildErrors(t *testing.T) {
	needHostFiles(t)
	tests := []struct {
		name     string
		noConfig bool   // the config file does not exist
		bad      string // contents of an invalid config
		pods     string // static pods added to a valid config
		format   string
		skip     string // asset left out
		want     []string
	}{
		{name: "missing config", noConfig: true, want: []string{"machine config: open ", "nosuch.yaml", "`cairn config gen` writes one"}},
		{
			name: "invalid config",
			bad: `apiVersion: cairn.dev/v1alpha1
kind: MachineConfig
machine:
  hostname: Not_A_Hostname
network:
  interfaces:
    - name: eth0
      addresses: ["10.0.0.1/24", "10.0.0.300/24"]
`,
			want: []string{"bad.yaml: ", "machine.hostname", `network.interfaces[0].addresses[1]: "10.0.0.300/24"`, "machine.api"},
		},
		{
			name: "invalid static pod",
			pods: "    - {apiVersion: v1, kind: Pod, metadata: {name: web}, spec: {containers: [{name: web}]}}\n",
			want: []string{"machine.yaml: ", "machine.staticPods[0].spec.containers[0].image: required"},
		},
		{name: "unknown format", format: "vdi", want: []string{`unknown image format "vdi": valid formats are gcp, iso, qcow2, raw, vhd, vmdk`}},
		{name: "missing node binary", skip: "init", want: []string{"input init missing: ", "`make build` builds it into the assets directory"}},
		{name: "missing component", skip: "cni/portmap", want: []string{"input cni/portmap missing: ", "`make components` builds it into the assets directory"}},
		{name: "missing shim", skip: "containerd-shim-runc-v2", want: []string{"input containerd-shim-runc-v2 missing: ", "`make build` builds it into the assets directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var config string
			switch {
			case tt.noConfig:
				config = filepath.Join(dir, "nosuch.yaml")
			case tt.bad != "":
				config = filepath.Join(dir, "bad.yaml")
				if err := os.WriteFile(config, []byte(tt.bad), 0o600); err != nil {
					t.Fatal(err)
				}
			default:
				config = machineConfig(t)
			}
			if tt.pods != "" {
				gen, err := os.ReadFile(config)
				if err != nil {
					t.Fatal(err)
				}
				data := strings.Replace(string(gen), "machine:\n", "machine:\n  staticPods:\n"+tt.pods, 1)
				if err := os.WriteFile(config, []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			before := dirNames(t, dir)
			_, err := Build(context.Background(), Options{
				Config:   config,
				Output:   filepath.Join(dir, "out", "node.raw"),
				Format:   tt.format,
				Assets:   fakeAssets(t, tt.skip),
				CacheDir: filepath.Join(dir, "cache"),
			})
			if err == nil {
				t.Fatal("Build succeeded")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Build error %q lacks %q", err, want)
				}
			}
			if after := dirNames(t, dir); !cmp.Equal(after, before) {
				t.Errorf("a failed build changed %s from %q to %q", dir, before, after)
			}
		})
	}
}

func TestOptionsDefaults(t *testing.T) {
	t.Setenv("CAIRN_CACHE", "/var/cache/cairn-test")
	progress := func(string) {}
	tests := []struct {
		name string
		in   Options
		want Options // Progress aside
	}{
		{
			name: "unset",
			want: Options{Format: "raw", CacheDir: "/var/cache/cairn-test", SourceDateEpoch: DefaultSourceDateEpoch},
		},
		{
			name: "set",
			in:   Options{Config: "c.yaml", Output: "o.raw", Format: "qcow2", Assets: "a", CacheDir: "/c", Size: 1 << 30, SourceDateEpoch: 1700000000, Progress: progress},
			want: Options{Config: "c.yaml", Output: "o.raw", Format: "qcow2", Assets: "a", CacheDir: "/c", Size: 1 << 30, SourceDateEpoch: 1700000000},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in.withDefaults()
			if got.Progress == nil {
				t.Error("withDefaults left Progress nil")
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreFields(Options{}, "Progress")); diff != "" {
				t.Errorf("withDefaults (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHostInputs wants every input named once, by a name the manifest
// accepts, and provided by a Debian package or a make target.
func TestHostInputs(t *testing.T) {
	seen := map[string]bool{}
	for _, in := range hostInputs(Options{Assets: "/assets"}) {
		if seen[in.name] {
			t.Errorf("input %s listed twice", in.name)
		}
		seen[in.name] = true
		if filepath.IsAbs(in.name) {
			t.Errorf("input %s: name is an absolute path, which the manifest refuses", in.name)
		}
		if (in.pkg == "") == (in.target == "") {
			t.Errorf("input %s: provided by the Debian package %q and the make target %q, want exactly one", in.name, in.pkg, in.target)
		}
		if in.target != "" && !strings.HasPrefix(in.path, "/assets/") {
			t.Errorf("input %s built by make %s is at %s, outside the assets", in.name, in.target, in.path)
		}
	}
}
