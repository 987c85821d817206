package build

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/rootfs"
	"github.com/cairn-os/cairn/test/need"
	"github.com/google/go-cmp/cmp"
)

// testCache returns a new cache directory holding the kernel of the
// shared cache (fetched there once), so that a test's boot parts neither
// come from nor go to another test's or the user's.
func testCache(t *testing.T) string {
	t.Helper()
	k, err := rootfs.FetchKernel(context.Background(), rootfs.DefaultCacheDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, p := range []string{k.Deb, k.Root} {
		if err := os.Symlink(p, filepath.Join(dir, filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// cacheEntries returns the names of the boot parts cached in cache.
func cacheEntries(t *testing.T, cache string) []string {
	t.Helper()
	dir := filepath.Join(cache, "boot")
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return nil
	}
	return dirNames(t, dir)
}

// fromCache says whether a build's progress lines say it took its boot
// parts from the cache.
func fromCache(lines []string) bool {
	return slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "boot parts from the cache") })
}

// TestBuildCache wants a build that reuses the cached boot parts to write
// the very bytes of a cold build (NoCache), for the same config and for a
// config that changed only what goes to STATE; a change of kernel
// arguments to build new parts; and NoCache to leave the cache alone.
func TestBuildCache(t *testing.T) {
	needBuildTools(t)
	cache, assets := testCache(t), fakeAssets(t, "")
	config := machineConfig(t)
	otherHost := filepath.Join(t.TempDir(), "machine.yaml")
	writeReplaced(t, config, otherHost, "hostname: build-test", "hostname: build-test-2")
	otherArgs := filepath.Join(t.TempDir(), "machine.yaml")
	writeReplaced(t, config, otherArgs, "machine:\n", "machine:\n  kernel:\n    args: [mitigations=off]\n")

	build := func(config string, noCache bool) (dir string, lines []string) {
		t.Helper()
		dir = t.TempDir()
		_, err := Build(context.Background(), Options{
			Config: config, Output: filepath.Join(dir, "node.raw"), Assets: assets, Size: testSize,
			CacheDir: cache, NoCache: noCache, Progress: func(l string) { lines = append(lines, l) },
		})
		if err != nil {
			t.Fatalf("Build(%s, NoCache %v): %v", config, noCache, err)
		}
		return dir, lines
	}
	same := func(what, a, b string) {
		t.Helper()
		for _, name := range []string{"node.raw", "manifest.json"} {
			if fileSHA(t, filepath.Join(a, name)) != fileSHA(t, filepath.Join(b, name)) {
				t.Errorf("%s: %s differs from the cold build's", what, name)
			}
		}
	}

	cold, lines := build(config, true)
	if fromCache(lines) || len(cacheEntries(t, cache)) != 0 {
		t.Fatalf("a NoCache build took its boot parts from the cache or left some there (%q)", cacheEntries(t, cache))
	}
	first, lines := build(config, false)
	if fromCache(lines) {
		t.Errorf("the first build took boot parts from an empty cache: %q", lines)
	}
	if n := len(cacheEntries(t, cache)); n != 1 {
		t.Errorf("the first build left %d boot parts in the cache, want 1", n)
	}
	same("first build", cold, first)
	warm, lines := build(config, false)
	if !fromCache(lines) {
		t.Errorf("a build with nothing changed did not reuse the cached boot parts: %q", lines)
	}
	same("build with nothing changed", cold, warm)

	coldHost, _ := build(otherHost, true)
	warmHost, lines := build(otherHost, false)
	if !fromCache(lines) {
		t.Errorf("a build whose config changed only its hostname did not reuse the boot parts: %q", lines)
	}
	same("build of another hostname", coldHost, warmHost)
	if fileSHA(t, filepath.Join(coldHost, "node.raw")) == fileSHA(t, filepath.Join(cold, "node.raw")) {
		t.Error("the disks of two hostnames are the same")
	}

	coldArgs, _ := build(otherArgs, true)
	warmArgs, lines := build(otherArgs, false)
	if fromCache(lines) {
		t.Errorf("a build with other kernel arguments reused boot parts: %q", lines)
	}
	same("build with other kernel arguments", coldArgs, warmArgs)
	if n := len(cacheEntries(t, cache)); n != 2 {
		t.Errorf("the cache holds %d boot parts, want 2 (one per kernel command line)", n)
	}

	// An entry damaged (its outputs list lost) is built again.
	for _, e := range cacheEntries(t, cache) {
		if err := os.Remove(filepath.Join(cache, "boot", e, outputsFile)); err != nil {
			t.Fatal(err)
		}
	}
	again, lines := build(config, false)
	if fromCache(lines) {
		t.Errorf("a damaged cache entry was used: %q", lines)
	}
	same("build over a damaged cache entry", cold, again)
}

// writeReplaced writes the file src to dst with old replaced by new.
func writeReplaced(t *testing.T, src, dst, old, new string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("%s lacks %q", src, old)
	}
	if err := os.WriteFile(dst, []byte(strings.Replace(string(data), old, new, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestPruneBoots wants the cache to keep the most recently used boot
// parts, and the one just made whatever its time.
func TestPruneBoots(t *testing.T) {
	cache := t.TempDir()
	now := time.Now()
	var names []string // the most recent first
	for i := range cachedBoots + 2 {
		names = append(names, fmt.Sprintf("entry-%d", i))
	}
	for i, name := range append(names, ".new-123") {
		p := filepath.Join(cache, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		at := now.Add(-time.Duration(i) * time.Hour)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	oldest := names[len(names)-1]
	pruneBoots(cache, filepath.Join(cache, oldest))
	want := append(append([]string{".new-123"}, names[:cachedBoots]...), oldest)
	if got := dirNames(t, cache); !cmp.Equal(got, want) {
		t.Errorf("after pruning the cache holds %q, want %q", got, want)
	}
}

// TestBuildAll builds a directory of configs and wants each image and
// manifest to be those of a cold build of its config alone; and a
// directory holding an invalid config to build nothing, naming it and its
// field.
func TestBuildAll(t *testing.T) {
	needBuildTools(t)
	cache, assets := testCache(t), fakeAssets(t, "")
	configs := t.TempDir()
	base := machineConfig(t)
	for _, n := range []string{"1", "2", "3"} {
		writeReplaced(t, base, filepath.Join(configs, "node-"+n+".yaml"), "hostname: build-test", "hostname: node-"+n)
	}
	out := filepath.Join(t.TempDir(), "images")
	var mu sync.Mutex
	var lines []string
	images, err := BuildAll(context.Background(), Options{
		Config: configs, Output: out, Format: "qcow2", Assets: assets, Size: testSize, CacheDir: cache,
		Progress: func(l string) { mu.Lock(); lines = append(lines, l); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"node-1.manifest.json", "node-1.qcow2", "node-2.manifest.json", "node-2.qcow2", "node-3.manifest.json", "node-3.qcow2"}
	if got := dirNames(t, out); !cmp.Equal(got, want) {
		t.Errorf("BuildAll wrote %q, want %q", got, want)
	}
	if len(images) != 3 || images[0] != filepath.Join(out, "node-1.qcow2") {
		t.Errorf("BuildAll returned %q", images)
	}
	if n := len(cacheEntries(t, cache)); n != 1 {
		t.Errorf("three configs of one kernel command line left %d boot parts, want 1", n)
	}
	writeUKI := func(l string) bool { return strings.HasSuffix(l, "] write UKI") } // the stage's start
	if n := len(slices.DeleteFunc(slices.Clone(lines), func(l string) bool { return !writeUKI(l) })); n != 1 {
		t.Errorf("BuildAll wrote the UKI %d times, want once: %q", n, lines)
	}
	for _, n := range []string{"1", "3"} {
		dir := t.TempDir()
		single := filepath.Join(dir, "node-"+n+".qcow2")
		if _, err := Build(context.Background(), Options{
			Config: filepath.Join(configs, "node-"+n+".yaml"), Output: single, Format: "qcow2", Assets: assets, Size: testSize, CacheDir: cache, NoCache: true,
		}); err != nil {
			t.Fatal(err)
		}
		if fileSHA(t, single) != fileSHA(t, filepath.Join(out, "node-"+n+".qcow2")) {
			t.Errorf("node-%s.qcow2 differs from the image of a cold build of its config alone", n)
		}
		if fileSHA(t, filepath.Join(dir, "manifest.json")) != fileSHA(t, filepath.Join(out, "node-"+n+".manifest.json")) {
			t.Errorf("node-%s.manifest.json differs from the manifest of a cold build of its config alone", n)
		}
	}

	t.Run("invalid config", func(t *testing.T) {
		writeReplaced(t, base, filepath.Join(configs, "node-4.yaml"), "hostname: build-test", "hostname: Not_A_Hostname")
		out := filepath.Join(t.TempDir(), "images")
		_, err := BuildAll(context.Background(), Options{Config: configs, Output: out, Assets: assets, CacheDir: cache})
		if err == nil || !strings.Contains(err.Error(), "node-4.yaml: ") || !strings.Contains(err.Error(), "machine.hostname") {
			t.Errorf("BuildAll with an invalid config: error %v, want it to name node-4.yaml and machine.hostname", err)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("BuildAll with an invalid config made %s (%v)", out, err)
		}
	})
	t.Run("no configs", func(t *testing.T) {
		_, err := BuildAll(context.Background(), Options{Config: t.TempDir(), Output: t.TempDir(), Assets: assets, CacheDir: cache})
		if err == nil || !strings.Contains(err.Error(), "holds no machine config") {
			t.Errorf("BuildAll of an empty directory: error %v", err)
		}
	})
}

// TestBuildGeneric builds an image with no machine config: its manifest
// has no machine-config input, and its STATE holds no file; and wants
// a config and Generic together refused.
func TestBuildGeneric(t *testing.T) {
	needBuildTools(t)
	need.Tool(t, "debugfs", "e2fsprogs")
	cache, assets := testCache(t), fakeAssets(t, "")
	out := filepath.Join(t.TempDir(), "generic.raw")
	m, err := Build(context.Background(), Options{Generic: true, Output: out, Assets: assets, Size: testSize, CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(m.Inputs, func(a image.Artifact) bool { return a.Name == "machine-config" }) {
		t.Error("a generic image's manifest lists a machine config")
	}
	if names := stateFiles(t, out); len(names) != 0 {
		t.Errorf("a generic image's STATE holds %q, want nothing", names)
	}
	// The same read of an image of a config finds it.
	withConfig := filepath.Join(t.TempDir(), "node.raw")
	if _, err := Build(context.Background(), Options{Config: machineConfig(t), Output: withConfig, Assets: assets, Size: testSize, CacheDir: cache}); err != nil {
		t.Fatal(err)
	}
	if names, want := stateFiles(t, withConfig), []string{"config.yaml", "first-boot.yaml"}; !cmp.Equal(names, want) {
		t.Errorf("the STATE of an image of a config holds %q, want %q", names, want)
	}

	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"a config too", Options{Generic: true, Config: machineConfig(t)}, "a generic image has no machine config"},
		{"an argument of Cairn's", Options{Generic: true, KernelArgs: []string{"cairn.config.url=https://config.example/m.yaml", "console=ttyS1"}}, `machine.kernel.args[1]: "console=ttyS1" is Cairn's`},
		{"arguments to a config's image", Options{Config: machineConfig(t), KernelArgs: []string{"quiet"}}, "are its machine.kernel.args"},
	} {
		tc.o.Output, tc.o.Assets, tc.o.CacheDir = filepath.Join(t.TempDir(), "node.raw"), assets, cache
		if _, err := Build(context.Background(), tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Build with %s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// stateFiles lists the files of the STATE partition of the disk image at
// path (100 MiB from 257 MiB, as image.WriteRaw lays it out), with
// debugfs.
func stateFiles(t *testing.T, path string) []string {
	t.Helper()
	disk, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer disk.Close()
	state := filepath.Join(t.TempDir(), "state.img")
	f, err := os.Create(state)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, io.NewSectionReader(disk, 257<<20, 100<<20)); err != nil {
		t.Fatal(err)
	}
	ls, err := exec.Command("debugfs", "-R", "ls -p /", state).Output()
	if err != nil {
		t.Fatalf("debugfs ls: %v", err)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(ls)), "\n") {
		// /inode/mode/uid/gid/name/size/
		if fields := strings.Split(line, "/"); len(fields) > 5 && fields[5] != "." && fields[5] != ".." && fields[5] != "lost+found" {
			names = append(names, fields[5])
		}
	}
	slices.Sort(names)
	return names
}
