//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/qemu"
)

// BenchmarkImageBuild prints the build time with an empty kernel cache
// (cold: download, extract, depmod) and a full one (warm), and the sizes of
// what it built.
func BenchmarkImageBuild(b *testing.B) {
	cfgDir := b.TempDir()
	cairn(b, "config", "gen", "--out", cfgDir)
	config := filepath.Join(cfgDir, "machine.yaml")
	for _, tc := range []struct {
		name  string
		cache string
	}{{"cold", b.TempDir()}, {"warm", ""}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				out := filepath.Join(b.TempDir(), "node.raw")
				args := []string{"image", "build", "-c", config, "-o", out, "--assets", binDir}
				if tc.cache != "" {
					os.RemoveAll(tc.cache)
					args = append(args, "--cache", tc.cache)
				}
				start := time.Now()
				cairn(b, args...)
				b.ReportMetric(time.Since(start).Seconds(), "build-s")
				reportSizes(b, filepath.Dir(out))
			}
		})
	}
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
