//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"debug/pe"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/qemu"
	"github.com/klauspost/compress/zstd"
	"github.com/u-root/u-root/pkg/cpio"
)

// BenchmarkImageBuild prints the build time with empty caches (cold:
// kernel download, extract, depmod, boot parts), with nothing changed
// since the last build (warm: its boot parts from the cache), with only
// the config's hostname changed (config-only), and of 100 configs at once
// (configs-100); the sizes of what it built, the size of each format, and
// a table of where the UKI's bytes are.
func BenchmarkImageBuild(b *testing.B) {
	cfgDir := b.TempDir()
	cairn(b, "config", "gen", "--out", cfgDir)
	config := filepath.Join(cfgDir, "machine.yaml")
	data, err := os.ReadFile(config)
	if err != nil {
		b.Fatal(err)
	}
	if !bytes.Contains(data, []byte("hostname: cairn-node")) {
		b.Fatalf("the generated config has not the hostname cairn-node:\n%s", data)
	}
	hostname := func(name string) []byte {
		return bytes.Replace(data, []byte("hostname: cairn-node"), []byte("hostname: "+name), 1)
	}
	build := func(b *testing.B, args ...string) time.Duration {
		start := time.Now()
		cairn(b, append([]string{"image", "build", "--assets", binDir}, args...)...)
		return time.Since(start)
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			out, cache := filepath.Join(b.TempDir(), "node.raw"), b.TempDir()
			b.ReportMetric(build(b, "-c", config, "-o", out, "--cache", cache).Seconds(), "build-s")
			reportSizes(b, filepath.Dir(out))
			uki := filepath.Join(b.TempDir(), "node.efi")
			build(b, "-c", config, "-o", uki, "--uki", "--cache", cache)
			ukiTable(b, uki)
		}
	})
	b.Run("warm", func(b *testing.B) {
		build(b, "-c", config, "-o", filepath.Join(b.TempDir(), "node.raw")) // fills the cache if need be
		for b.Loop() {
			b.ReportMetric(build(b, "-c", config, "-o", filepath.Join(b.TempDir(), "node.raw")).Seconds(), "build-s")
		}
	})
	b.Run("config-only", func(b *testing.B) {
		build(b, "-c", config, "-o", filepath.Join(b.TempDir(), "node.raw"))
		for i := 0; b.Loop(); i++ {
			changed := filepath.Join(b.TempDir(), "machine.yaml")
			if err := os.WriteFile(changed, hostname(fmt.Sprintf("changed-%d", i)), 0o600); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(build(b, "-c", changed, "-o", filepath.Join(b.TempDir(), "node.raw")).Seconds(), "build-s")
		}
	})
	b.Run("configs-100", func(b *testing.B) {
		dir := b.TempDir()
		for i := 1; i <= 100; i++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("node-%d.yaml", i)), hostname(fmt.Sprintf("node-%d", i)), 0o600); err != nil {
				b.Fatal(err)
			}
		}
		build(b, "-c", config, "-o", filepath.Join(b.TempDir(), "node.raw"))
		for b.Loop() {
			out := b.TempDir()
			b.ReportMetric(build(b, "--configs", dir, "-o", out).Seconds(), "build-s")
			os.RemoveAll(out) // 100 disks
		}
	})
	b.Run("formats", func(b *testing.B) {
		for b.Loop() {
			for _, f := range []struct{ format, ext string }{{"raw", "raw"}, {"qcow2", "qcow2"}, {"vhd", "vhd"}, {"vmdk", "vmdk"}, {"gcp", "tar.gz"}, {"iso", "iso"}} {
				out := filepath.Join(b.TempDir(), "node."+f.ext)
				build(b, "-c", config, "-o", out, "--format", f.format)
				var st syscall.Stat_t
				if err := syscall.Stat(out, &st); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(st.Size)/1e6, f.format+"-MB")
				b.ReportMetric(float64(st.Blocks*512)/1e6, f.format+"-allocated-MB")
			}
		}
	})
	// Boots the ISO with an empty disk: the installer's time to write the
	// disk, and QEMU start → the installed node's API (two boots).
	b.Run("iso-install", func(b *testing.B) {
		for b.Loop() {
			in := installFromISO(b, "bench-node")
			b.ReportMetric(in.write.Seconds(), "install-write-s")
			b.ReportMetric(in.ready.Seconds(), "qemu-to-installed-api-s")
			in.vm.Kill()
		}
	})
}

// ukiTable logs where the bytes of the UKI are: its kernel, and each file
// of its root filesystem by its size alone compressed with zstd (an
// estimate of its share of the squashfs), largest first.
func ukiTable(b *testing.B, uki string) {
	f, err := pe.Open(uki)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var table strings.Builder
	fmt.Fprintf(&table, "%-58s %10s %10s\n", "UKI part", "bytes", "zstd")
	for _, name := range []string{".linux", ".initrd"} {
		if s := f.Section(name); s != nil {
			fmt.Fprintf(&table, "%-58s %10d\n", "section "+name, s.VirtualSize)
		}
	}
	initrd, err := f.Section(".initrd").Data()
	if err != nil {
		b.Fatal(err)
	}
	records, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(initrd)))
	if err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(b.TempDir(), "root")
	for _, r := range records {
		if r.Name != "rootfs.sqsh" {
			if r.FileSize > 0 {
				fmt.Fprintf(&table, "%-58s %10d\n", "initramfs "+r.Name, r.FileSize)
			}
			continue
		}
		sqsh := filepath.Join(b.TempDir(), "rootfs.sqsh")
		data, err := io.ReadAll(io.NewSectionReader(r, 0, int64(r.FileSize)))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(sqsh, data, 0o644); err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(&table, "%-58s %10d\n", "initramfs rootfs.sqsh", r.FileSize)
		if out, err := exec.Command("unsquashfs", "-q", "-d", root, sqsh).CombinedOutput(); err != nil {
			b.Fatalf("unsquashfs: %v\n%s", err, out)
		}
	}
	type entry struct {
		name       string
		size, zstd int64
	}
	var files []entry
	byInode := map[uint64]int{} // a hard link's file, listed once under all its names
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	if err != nil {
		b.Fatal(err)
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			return err
		}
		if i, ok := byInode[st.Ino]; ok {
			files[i].name += " = " + rel
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		byInode[st.Ino] = len(files)
		files = append(files, entry{rel, int64(len(data)), int64(len(enc.EncodeAll(data, nil)))})
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	slices.SortFunc(files, func(x, y entry) int { return int(y.zstd - x.zstd) })
	var size, compressed int64
	for i, e := range files {
		size, compressed = size+e.size, compressed+e.zstd
		if i < 20 {
			fmt.Fprintf(&table, "%-58s %10d %10d\n", "  "+e.name, e.size, e.zstd)
		}
	}
	fmt.Fprintf(&table, "%-58s %10d %10d\n", fmt.Sprintf("  root filesystem, %d files", len(files)), size, compressed)
	b.Logf("where the UKI's bytes are:\n%s", table.String())
}

// reportSizes reads the sizes from the build's manifest and the disk's
// allocated blocks.
func reportSizes(b *testing.B, dir string) {
	m, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"uki", "initramfs", "rootfs.sqsh"} {
		b.ReportMetric(float64(artifactSize(b, m, name))/1e6, name+"-MB")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "node.raw"), &st); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(st.Blocks*512)/1e6, "disk-allocated-MB")
	b.ReportMetric(float64(st.Size)/1e6, "disk-apparent-MB")
}

// BenchmarkBoot boots the default image once and prints, in guest time,
// kernel start → init and init → API ready, the wall time to API ready,
// the time a config takes to be applied live (applyLive), and the times of
// an upgrade cycle (upgradeCycle), from each call: a broken upgrade to the
// old version's API again, an upgrade to the new version's API and to its
// blessing, and a rollback to the old version's API.
func BenchmarkBoot(b *testing.B) {
	dir := b.TempDir()
	port := freePort(b)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	cairn(b, "config", "gen", "--out", dir, "--endpoint", endpoint)
	cairn(b, "image", "build", "-c", filepath.Join(dir, "machine.yaml"), "-o", filepath.Join(dir, "node.raw"), "--assets", binDir)
	c, _ := dialNode(b, dir, endpoint)
	for b.Loop() {
		vm, err := qemu.Start(qemu.Options{Disk: filepath.Join(dir, "node.raw"), APIPort: port})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		var first *machine.VersionResponse
		err = vm.WaitReady(ctx, "the API", func(ctx context.Context) error {
			v, err := c.Version(ctx, &machine.VersionRequest{})
			first = v
			return err
		}, nil)
		wall := time.Since(start)
		cancel()
		if err != nil {
			vm.Kill()
			b.Fatal(err)
		}
		initStart := first.BootTimeline[0].Start.AsDuration()
		b.ReportMetric(wall.Seconds(), "wall-to-api-s")
		b.ReportMetric(initStart.Seconds(), "guest-kernel-to-init-s")
		// Services report when they became Ready on the boot clock; the
		// agent is Ready when its API port accepts connections.
		ready := waitServices(b, c, "containerd", "cairn-agent")
		for _, name := range []string{"containerd", "cairn-agent"} {
			b.ReportMetric(ready[name].Seconds(), "guest-"+name+"-ready-s")
		}
		b.ReportMetric((ready["cairn-agent"] - initStart).Seconds(), "guest-init-to-api-s")
		b.ReportMetric(first.BootTimeline[len(first.BootTimeline)-1].Start.AsDuration().Seconds(), "guest-start-services-s")
		b.ReportMetric(applyLive(b, c, filepath.Join(dir, "machine.yaml")).Seconds()*1000, "apply-live-ms")
		up := upgradeCycle(b, context.Background(), c, filepath.Join(dir, "cairnconfig"), filepath.Join(dir, "machine.yaml"), nil, "", nil)
		b.ReportMetric(up.upgraded.Seconds(), "upgrade-to-api-s")
		b.ReportMetric(up.blessed.Seconds(), "upgrade-to-blessed-s")
		b.ReportMetric(up.brokenRolledBack.Seconds(), "broken-upgrade-to-old-api-s")
		b.ReportMetric(up.rolledBack.Seconds(), "rollback-to-api-s")
		c.Shutdown(context.Background(), &machine.ShutdownRequest{})
		select {
		case <-vm.Done():
		case <-time.After(time.Minute):
			vm.Kill()
		}
	}
}

// applyLiveRuns is how many configs applyLive applies.
const applyLiveRuns = 7

// applyLive applies configs that differ in a sysctl and a machine file
// live, one after the other, each checked in the kernel once the call
// returned, and returns the median time from the call to its return.
func applyLive(b *testing.B, c *client.Client, config string) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := machineconfig.Load(config)
	if err != nil {
		b.Fatal(err)
	}
	var took []time.Duration
	for i := range applyLiveRuns {
		v := strconv.Itoa(10 + i)
		cfg.Machine.Sysctls = map[string]string{"vm.swappiness": v}
		cfg.Machine.Files = []machineconfig.File{{Path: "/etc/cairn-bench/applied", Content: v}}
		doc, err := cfg.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if _, err := c.ApplyConfig(ctx, &machine.ApplyConfigRequest{Config: doc, Mode: machine.ApplyMode_APPLY_MODE_NO_REBOOT}); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(t0))
		if got, err := readNode(ctx, c, "/proc/sys/vm/swappiness"); err != nil || got != v {
			b.Fatalf("vm.swappiness = %q, %v once applied, want %s", got, err, v)
		}
	}
	slices.Sort(took)
	fmt.Printf("apply live (sysctl + file, %d runs): call to applied min %s, median %s, max %s\n", applyLiveRuns,
		took[0].Round(time.Microsecond), took[len(took)/2].Round(time.Microsecond), took[len(took)-1].Round(time.Microsecond))
	return took[len(took)/2]
}

// waitServices waits until the named services are Ready and returns when
// each became so, on the node's boot clock.
func waitServices(b *testing.B, c *client.Client, names ...string) map[string]time.Duration {
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := c.Services(context.Background(), &machine.ServicesRequest{})
		if err != nil {
			continue
		}
		ready := map[string]time.Duration{}
		for _, s := range resp.Services {
			if s.State == "Ready" {
				ready[s.Name] = s.SinceBoot.AsDuration()
			}
		}
		all := true
		for _, n := range names {
			_, ok := ready[n]
			all = all && ok
		}
		if all {
			return ready
		}
	}
	b.Fatalf("services %v not Ready after 3 minutes", names)
	return nil
}
