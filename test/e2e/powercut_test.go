//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/qemu"
)

// powerCuts is how many times TestPowerCut cuts the power during an apply
// and during an upgrade: $CAIRN_POWERCUT_N, default 20.
func powerCuts(t *testing.T) int {
	v := os.Getenv("CAIRN_POWERCUT_N")
	if v == "" {
		return 20
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("CAIRN_POWERCUT_N=%q: want a count of at least 1", v)
	}
	return n
}

// TestPowerCut kills QEMU at random points during a config apply and
// during an upgrade, powerCuts times each, and boots the disk again after
// each: the node must come back, running the old or the new config and
// UKI whole. $CAIRN_POWERCUT_SEED replays a run's random points.
func TestPowerCut(t *testing.T) {
	n := powerCuts(t)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CAIRN_POWERCUT_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CAIRN_POWERCUT_SEED=%q: %v", v, err)
		}
	}
	t.Logf("%d power cuts each; CAIRN_POWERCUT_SEED=%d replays them", n, seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	cairn(t, "config", "gen", "--out", dir, "--hostname", "powercut", "--endpoint", endpoint)
	config := filepath.Join(dir, "machine.yaml")
	disk := filepath.Join(dir, "node.raw")
	cairn(t, "image", "build", "-c", config, "-o", disk, "--assets", binDir)
	c, _ := dialNode(t, dir, endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	ready := apiReady(c)
	// boot boots the disk and waits at most 5 minutes for the API: an
	// unbootable node fails the test.
	boot := func() *qemu.VM {
		t.Helper()
		bootCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		return bootAgain(t, bootCtx, disk, port, ready)
	}
	vm := boot()
	// cut kills the VM delay after op starts, whatever op is doing then,
	// and boots the disk again.
	cut := func(delay time.Duration, op func()) {
		t.Helper()
		timer := time.AfterFunc(delay, func() { vm.Kill() })
		op()
		<-vm.Done()
		timer.Stop()
		vm = boot()
	}

	t.Run("Apply", func(t *testing.T) {
		survived := 0
		for i := range n {
			// A config applied with a reboot is on trial at the boot after
			// it, and a cut before it shows it is healthy takes the node
			// back to the one before it, by design: each cut tests one
			// apply, on a node whose config is kept.
			v := waitOffTrial(t, ctx, c)
			oldGen := v.Config.Generation
			oldSwap, _ := readNode(ctx, c, "/proc/sys/vm/swappiness")
			oldFile, _ := readNode(ctx, c, appliedFile)
			swap, file := strconv.Itoa(11+i), fmt.Sprintf("powercut=%d", i)
			doc := nodeConfigDoc(t, config, func(cfg *machineconfig.Config) {
				cfg.Machine.Sysctls = map[string]string{"vm.swappiness": swap}
				cfg.Machine.Files = []machineconfig.File{{Path: appliedFile, Content: file + "\n", Mode: 0o644}}
			})
			// A live apply takes about 0.1-0.3 s; a reboot one goes on to the
			// shutdown: cut anywhere in the first second.
			mode := []machine.ApplyMode{machine.ApplyMode_APPLY_MODE_AUTO, machine.ApplyMode_APPLY_MODE_REBOOT}[i%2]
			delay := time.Duration(rng.Int64N(int64(time.Second)))
			cut(delay, func() {
				callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				c.ApplyConfig(callCtx, &machine.ApplyConfigRequest{Config: doc, Mode: mode}) // cut at any point: its result does not count
			})
			v, err := c.Version(ctx, &machine.VersionRequest{})
			if err != nil {
				t.Fatal(err)
			}
			gotSwap, err1 := readNode(ctx, c, "/proc/sys/vm/swappiness")
			gotFile, err2 := readNode(ctx, c, appliedFile)
			isOld := v.Config.Generation == oldGen && gotSwap == oldSwap && (gotFile == oldFile || err2 != nil && oldFile == "")
			isNew := v.Config.Generation == oldGen+1 && gotSwap == swap && gotFile == file
			t.Logf("cut %d (%s, %s after the call): generation %d, swappiness %s, %s = %q", i+1, mode, delay.Round(time.Millisecond), v.Config.Generation, gotSwap, appliedFile, gotFile)
			if err1 != nil || !isOld && !isNew {
				t.Errorf("cut %d: generation %d, swappiness %q (%v), file %q (%v); want all of generation %d (%s, %q) or all of %d (%s, %q)",
					i+1, v.Config.Generation, gotSwap, err1, gotFile, err2, oldGen, oldSwap, oldFile, oldGen+1, swap, file)
				continue
			}
			survived++
		}
		fmt.Printf("power cuts during apply: %d of %d survived (the old or the new config, whole)\n", survived, n)
	})

	t.Run("Upgrade", func(t *testing.T) {
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		a := v.CairnVersion
		u := buildUpgradeUKIs(t, config, a)
		size := fileSize(t, u.good)
		survived := 0
		for i := range n {
			// The UKI goes through QEMU's user network in about 10 s,
			// then is written and the node reboots into it: cut anywhere
			// in 30 s.
			delay := time.Duration(rng.Int64N(int64(30 * time.Second)))
			cut(delay, func() {
				callCtx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				if stream, err := c.Upgrade(callCtx); err == nil {
					client.SendUKI(stream, u.good, &machine.UpgradeHeader{}, func(*machine.UpgradeProgress) {}) // cut at any point
				}
			})
			v, err := c.Version(ctx, &machine.VersionRequest{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("cut %d (%s after the call, UKI of %d MB): %s, boot %v", i+1, delay.Round(time.Millisecond), size>>20, v.CairnVersion, v.Boot)
			switch b := v.Boot; {
			case b.Error != "":
				t.Errorf("cut %d: the boot entries: %s", i+1, b.Error)
			case v.CairnVersion == a && b.Entry == "cairn-"+a+".efi" && b.Blessed:
				survived++ // the old UKI
			case v.CairnVersion == u.version:
				// The new one, on trial: blessed once healthy; then back to
				// a for the next cut.
				waitBlessed(t, ctx, c, u.version)
				if _, err := c.Rollback(ctx, &machine.RollbackRequest{}); err != nil {
					t.Fatalf("cut %d: rollback to %s: %v", i+1, a, err)
				}
				// The guest reboots; QEMU goes on.
				awayAndBack(t, ctx, vm, ready, "the rollback")
				if v, err := c.Version(ctx, &machine.VersionRequest{}); err != nil || v.CairnVersion != a {
					t.Fatalf("cut %d: after the rollback: %v, %v; want %s", i+1, v, err, a)
				}
				survived++
			default:
				t.Errorf("cut %d: runs %s with boot %v; want %s or %s whole", i+1, v.CairnVersion, b, a, u.version)
			}
		}
		fmt.Printf("power cuts during upgrade: %d of %d survived (the old or the new UKI, whole)\n", survived, n)
	})
	shutdown(t, ctx, c, vm)
}

// waitBlessed waits until the node runs version blessed.
func waitBlessed(t *testing.T, ctx context.Context, c *client.Client, version string) {
	t.Helper()
	waitVersion(t, ctx, c, version+" blessed", func(v *machine.VersionResponse) bool {
		return v.CairnVersion == version && v.Boot.GetBlessed()
	})
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// waitOffTrial waits, up to 5 minutes, until the config the node booted
// with is no longer on trial, and returns its Version then.
func waitOffTrial(t *testing.T, ctx context.Context, c *client.Client) *machine.VersionResponse {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(time.Second) {
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if err == nil && !v.Config.GetOnTrial() {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node's config is still on trial after 5 minutes (%v)", err)
		}
	}
}
