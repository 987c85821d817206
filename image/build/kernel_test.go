package build

import (
	"bufio"
	"bytes"
	"context"
	"debug/pe"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/google/go-cmp/cmp"
	"github.com/u-root/u-root/pkg/cpio"

	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/internal/version"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/rootfs"
)

// withMachine writes a generated machine config with more under machine
// (YAML indented by two spaces) and returns its path.
func withMachine(t *testing.T, more string) string {
	t.Helper()
	config := machineConfig(t)
	gen, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	data := strings.Replace(string(gen), "machine:\n", "machine:\n"+more, 1)
	if err := os.WriteFile(config, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return config
}

// TestBuildKernelArgsModules builds an image with machine.kernel and
// reads it back from the disk: the UKI's .cmdline is the image's command
// line with the machine's arguments after it, and the module list of the
// root filesystem names the machine's modules after their dependencies
// (from the kernel package's modules.dep), each module's file there.
func TestBuildKernelArgsModules(t *testing.T) {
	needBuildTools(t)
	config := withMachine(t, `  kernel:
    args: [mitigations=off, "dyndbg=\"file vxlan.c +p\""]
    modules: [vxlan, dummy]
`)
	out := filepath.Join(t.TempDir(), "node.raw")
	if _, err := Build(context.Background(), Options{Config: config, Output: out, Assets: fakeAssets(t, ""), CacheDir: testCache(t), Size: testSize}); err != nil {
		t.Fatalf("Build: %v", err)
	}
	uki := readUKI(t, out)

	want := KernelCmdline + ` mitigations=off dyndbg="file vxlan.c +p"`
	if got := string(ukiSection(t, uki, ".cmdline")); got != want {
		t.Errorf("UKI .cmdline = %q, want %q", got, want)
	}

	kernel, err := rootfs.FetchKernel(context.Background(), rootfs.DefaultCacheDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sqsh := squashFS(t, ukiSection(t, uki, ".initrd"))
	modDir := path.Join("lib/modules", kernel.Release)
	list := strings.Fields(unsquashfsCat(t, sqsh, path.Join(modDir, layout.ModuleList)))
	deps := modulesDep(t, filepath.Join(kernel.ModulesDir(), "modules.dep"))
	for _, mod := range []string{"kernel/drivers/net/vxlan/vxlan.ko", "kernel/drivers/net/dummy.ko"} {
		i := slices.Index(list, mod)
		if i < 0 {
			t.Errorf("module list %q lacks %s", list, mod)
			continue
		}
		if mod == "kernel/drivers/net/vxlan/vxlan.ko" && len(deps[mod]) == 0 {
			t.Errorf("modules.dep gives vxlan no dependencies: the test proves nothing of them")
		}
		for _, dep := range deps[mod] {
			if j := slices.Index(list, dep); j < 0 || j > i {
				t.Errorf("module list %q has %s at %d, want its dependency %s before it", list, mod, i, dep)
			}
		}
	}
	files := unsquashfsList(t, sqsh)
	for _, mod := range list {
		if !slices.Contains(files, path.Join(modDir, mod)) {
			t.Errorf("module list names %s, which the root filesystem lacks", mod)
		}
	}
}

// TestBuildUnknownModule wants a module the kernel package does not have
// to fail the build by its field path and name, with nothing written.
func TestBuildUnknownModule(t *testing.T) {
	needBuildTools(t)
	config := withMachine(t, "  kernel:\n    modules: [dummy, nosuch_module]\n")
	dir := t.TempDir()
	_, err := Build(context.Background(), Options{Config: config, Output: filepath.Join(dir, "out", "node.raw"), Assets: fakeAssets(t, ""), CacheDir: testCache(t), Size: testSize})
	if err == nil {
		t.Fatal("Build succeeded")
	}
	for _, want := range []string{`machine.kernel.modules[1]: module "nosuch_module" not found`, "the kernel package " + rootfs.KernelPackage} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Build error %q lacks %q", err, want)
		}
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("a failed build left %q in %s", names, dir)
	}
}

// TestCmdlineLen wants the longest command line the machine config
// accepts to fit the kernel's 2048 bytes, with its NUL.
func TestCmdlineLen(t *testing.T) {
	args := machineconfig.Kernel{Args: []string{strings.Repeat("a", machineconfig.MaxKernelArgsLen)}}
	if n := len(kernelCmdline(args)); n > 2047 {
		t.Errorf("kernelCmdline() of machine.kernel.args of %d bytes is %d bytes, more than the kernel's 2047", machineconfig.MaxKernelArgsLen, n)
	}
}

// TestOwnedCmdline wants each argument of KernelCmdline that Cairn's boot
// depends on (all but quiet) refused in machine.kernel.args.
func TestOwnedCmdline(t *testing.T) {
	args := slices.DeleteFunc(strings.Fields(KernelCmdline), func(a string) bool { return a == "quiet" })
	var b strings.Builder
	b.WriteString("  kernel:\n    args:\n")
	for _, a := range args {
		b.WriteString("      - " + a + "\n")
	}
	data, err := os.ReadFile(withMachine(t, b.String()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = machineconfig.Parse(data)
	var verr *machineconfig.ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Parse() = %v, want a *ValidationError", err)
	}
	var refused []string
	for _, fe := range verr.Errors {
		refused = append(refused, fe.Path)
	}
	var want []string
	for i := range args {
		want = append(want, fmt.Sprintf("machine.kernel.args[%d]", i))
	}
	if diff := cmp.Diff(want, refused); diff != "" {
		t.Errorf("refused arguments of %q (-want +got):\n%s", args, diff)
	}
}

// readUKI returns the UKI that the disk image raw boots, from its ESP.
func readUKI(t *testing.T, raw string) []byte {
	t.Helper()
	f, err := os.Open(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table, err := gpt.Read(f, 512, 512)
	if err != nil {
		t.Fatalf("partition table of %s: %v", raw, err)
	}
	var start int64 = -1
	for _, p := range table.Partitions {
		if p.Type == gpt.EFISystemPartition {
			start = p.GetStart()
		}
	}
	if start < 0 {
		t.Fatalf("%s has no ESP", raw)
	}
	name := "::/EFI/Linux/cairn-" + version.Version + ".efi"
	out := filepath.Join(t.TempDir(), "cairn.efi")
	cmd := exec.Command("mcopy", "-i", fmt.Sprintf("%s@@%d", raw, start), name, out)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mcopy %s from the ESP: %v\n%s", name, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ukiSection returns the contents of the named section of the UKI.
func ukiSection(t *testing.T, uki []byte, name string) []byte {
	t.Helper()
	f, err := pe.NewFile(bytes.NewReader(uki))
	if err != nil {
		t.Fatalf("UKI: %v", err)
	}
	s := f.Section(name)
	if s == nil {
		t.Fatalf("UKI has no %s section", name)
	}
	b, err := s.Data()
	if err != nil {
		t.Fatalf("section %s: %v", name, err)
	}
	return b[:min(len(b), int(s.VirtualSize))]
}

// squashFS writes the root squashfs of the initramfs to a file and returns
// its path.
func squashFS(t *testing.T, initrd []byte) string {
	t.Helper()
	records, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(initrd)))
	if err != nil {
		t.Fatalf("initramfs: %v", err)
	}
	for _, r := range records {
		if r.Name != "rootfs.sqsh" {
			continue
		}
		data, err := io.ReadAll(io.NewSectionReader(r, 0, int64(r.FileSize)))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "rootfs.sqsh")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Fatal("initramfs holds no rootfs.sqsh")
	return ""
}

func unsquashfsCat(t *testing.T, sqsh, name string) string {
	t.Helper()
	out, err := exec.Command("unsquashfs", "-cat", sqsh, name).Output()
	if err != nil {
		t.Fatalf("unsquashfs -cat %s: %v", name, err)
	}
	return string(out)
}

// unsquashfsList returns the paths in the squashfs, relative to its root.
func unsquashfsList(t *testing.T, sqsh string) []string {
	t.Helper()
	out, err := exec.Command("unsquashfs", "-lc", "-d", "", sqsh).Output()
	if err != nil {
		t.Fatalf("unsquashfs -lc: %v", err)
	}
	var files []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		files = append(files, strings.TrimPrefix(line, "/"))
	}
	return files
}

// modulesDep reads each module's dependencies from modules.dep.
func modulesDep(t *testing.T, file string) map[string][]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	deps := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if ok {
			deps[mod] = strings.Fields(rest)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return deps
}
