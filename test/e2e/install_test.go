//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/qemu"
)

// isoInstall is one install from an ISO in QEMU, until the installed
// node's API answered.
type isoInstall struct {
	vm    *qemu.VM
	c     *client.Client
	write time.Duration // the installer's, from finding the medium to the disk written
	ready time.Duration // QEMU start → the installed node's API answers
}

// installFromISO builds the ISO of a config of hostname whose
// machine.install names /dev/vda, boots it in QEMU with an empty 3 GiB
// virtio disk, and waits for the node installed on that disk to answer.
func installFromISO(t testing.TB, hostname string) *isoInstall {
	t.Helper()
	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	cairn(t, "config", "gen", "--out", dir, "--hostname", hostname, "--endpoint", endpoint)
	config := filepath.Join(dir, "machine.yaml")
	cairn(t, "config", "patch", config, "--patch", "machine: {install: {disk: /dev/vda}}", "-o", config)
	iso, disk := filepath.Join(dir, "node.iso"), filepath.Join(dir, "disk.raw")
	cairn(t, "image", "build", "-c", config, "--format", "iso", "-o", iso, "--assets", binDir)
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 3<<30); err != nil {
		t.Fatal(err)
	}
	c, _ := dialNode(t, dir, endpoint)

	in := &isoInstall{c: c}
	start := time.Now()
	in.vm = bootVM(t, qemu.Options{Disk: disk, CDROM: iso, APIPort: port})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := in.vm.WaitReady(ctx, "the API of the node installed from the ISO", apiReady(c), nil); err != nil {
		t.Fatal(err)
	}
	in.ready = time.Since(start)
	log, err := os.ReadFile(in.vm.Opts.ConsoleLog)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`installed: rebooting into the disk .*took=(\S+)`).FindSubmatch(log)
	if m == nil {
		t.Fatalf("the console does not say the install is done:\n%s", log)
	}
	if in.write, err = time.ParseDuration(string(m[1])); err != nil {
		t.Fatal(err)
	}
	return in
}

// TestInstallISO boots the ISO of a config with machine.install.disk set,
// with an empty disk attached, and wants the installer to write the disk
// and reboot, the firmware to boot the disk then (the ISO still in its
// drive), and the node's API to answer with the config's hostname.
func TestInstallISO(t *testing.T) {
	in := installFromISO(t, "installed-node")
	t.Logf("disk written in %s, API ready %s after QEMU started (accel %s)", in.write, in.ready.Round(time.Second), in.vm.Accel())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := in.c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Hostname != "installed-node" {
		t.Errorf("Version().Hostname = %q, want installed-node, the ISO's config's", v.Hostname)
	}
	for _, name := range []string{"install from an install medium", "mount STATE", "load machine config"} {
		if s := step(v.BootTimeline, name); s == nil || s.Error != "" {
			t.Errorf("boot step %q = %v, want it done without error", name, s)
		}
	}
	log, err := os.ReadFile(in.vm.Opts.ConsoleLog)
	if err != nil {
		t.Fatal(err)
	}
	// The boot entry went into OVMF's variables through efivarfs.
	for _, want := range []string{"installing disk=/dev/vda (3.0 GiB) from=/dev/sr0", `boot entry written, first in the firmware's boot order entry=Boot`} {
		if !strings.Contains(string(log), want) {
			t.Errorf("console log lacks %q:\n%s", want, log)
		}
	}
	// OVMF says what it boots: the CD-ROM (on SATA) first, then the disk.
	loads := regexp.MustCompile(`BdsDxe: loading Boot[0-9A-F]+ "[^"]*" from (\S+)`).FindAllStringSubmatch(string(log), -1)
	if len(loads) < 2 || !strings.Contains(loads[0][1], "Sata(") || strings.Contains(loads[len(loads)-1][1], "Sata(") {
		t.Errorf("firmware boots %v, want the CD-ROM (Sata) first and the disk last", loads)
	}
}
