package stage2

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/need"
)

// noCloudVolume writes user-data and meta-data into a new filesystem
// image of fstype (vfat or iso9660) labelled label, attaches it to a
// loop device, and returns the device's name.
func noCloudVolume(t *testing.T, fstype, label string, userData []byte, metaData ...string) string {
	t.Helper()
	need.Root(t, "loop devices and mounts")
	dir := t.TempDir()
	files := filepath.Join(dir, "files")
	if err := os.Mkdir(files, 0o755); err != nil {
		t.Fatal(err)
	}
	meta := "instance-id: test\n" + strings.Join(metaData, "")
	for name, data := range map[string][]byte{"user-data": userData, "meta-data": []byte(meta)} {
		if err := os.WriteFile(filepath.Join(files, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(dir, "volume.img")
	var cmds [][]string
	switch fstype {
	case "vfat":
		need.Tool(t, "mkfs.vfat", "dosfstools")
		need.Tool(t, "mcopy", "mtools")
		cmds = [][]string{
			{"mkfs.vfat", "-n", label, "-C", img, "2048"},
			{"mcopy", "-i", img, filepath.Join(files, "user-data"), filepath.Join(files, "meta-data"), "::/"},
		}
	case "iso9660":
		need.Tool(t, "xorriso", "xorriso")
		cmds = [][]string{{"xorriso", "-as", "mkisofs", "-quiet", "-V", label, "-J", "-r", "-o", img, files}}
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	// losetup attaches with LOOP_CONFIGURE, which drops what the page
	// cache kept of the device's earlier file.
	losetup := need.Tool(t, "losetup", "util-linux")
	out, err := exec.Command(losetup, "--find", "--show", "--read-only", img).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command(losetup, "-d", dev).Run() })
	return filepath.Base(dev)
}

// firstConfigs returns a valid machine config of hostname, as a node's
// first config comes, and the same with an invalid hostname.
func firstConfigs(t *testing.T, hostname string) (valid, invalid []byte) {
	t.Helper()
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: hostname})
	if err != nil {
		t.Fatal(err)
	}
	if valid, err = b.Config.Marshal(); err != nil {
		t.Fatal(err)
	}
	return valid, []byte(strings.Replace(string(valid), "hostname: "+hostname, "hostname: Not_A_Hostname", 1))
}

// TestNoCloudFirstBoot gives STATE its machine config from a NoCloud
// volume, vfat or iso9660, among other block devices; and wants nothing
// read when STATE has a config, and nothing written for an invalid config
// or no volume, with errors that say why.
func TestNoCloudFirstBoot(t *testing.T) {
	valid, invalid := firstConfigs(t, "from-cidata")
	other := noCloudVolume(t, "vfat", "OTHER", valid)

	// sysBlock lists the devices looked at, as /sys/class/block does.
	sysBlock := func(devs ...string) string {
		dir := t.TempDir()
		for _, d := range devs {
			if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	run := func(sys string, stateHas []byte) (dev, state, firstBoot string, err error) {
		dir := t.TempDir()
		state, firstBoot = filepath.Join(dir, "config.yaml"), filepath.Join(dir, "first-boot.yaml")
		if stateHas != nil {
			if err := os.WriteFile(state, stateHas, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		dev, err = noCloudFirstBoot(sys, "/dev", state, firstBoot)
		return dev, state, firstBoot, err
	}
	read := func(p string) string {
		data, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		return string(data)
	}

	for _, tc := range []struct{ fstype, label string }{{"vfat", "CIDATA"}, {"iso9660", "cidata"}} {
		t.Run(tc.fstype, func(t *testing.T) {
			vol := noCloudVolume(t, tc.fstype, tc.label, valid)
			dev, state, firstBoot, err := run(sysBlock(other, vol), nil)
			if err != nil || dev != "/dev/"+vol {
				t.Fatalf("noCloudFirstBoot = %q, %v; want /dev/%s", dev, err, vol)
			}
			if read(state) != string(valid) || read(firstBoot) != string(valid) {
				t.Errorf("STATE's config.yaml %q and first-boot.yaml %q, want the volume's user-data", read(state), read(firstBoot))
			}
		})
	}
	// One user-data for many machines, each named by its meta-data.
	t.Run("hostname from meta-data", func(t *testing.T) {
		noHostname := []byte(strings.Replace(string(valid), "  hostname: from-cidata\n", "", 1))
		for _, tc := range []struct {
			name     string
			userData []byte
			want     string
		}{{"config without one", noHostname, "from-meta"}, {"config with one", valid, "from-cidata"}} {
			vol := noCloudVolume(t, "vfat", "CIDATA", tc.userData, "local-hostname: from-meta\n")
			_, state, firstBoot, err := run(sysBlock(vol), nil)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			cfg, err := machineconfig.Parse([]byte(read(state)))
			if err != nil || cfg.Machine.Hostname != tc.want || read(firstBoot) != read(state) {
				t.Errorf("%s: STATE's config has the hostname %v (%v), want %s, first-boot.yaml the same", tc.name, cfg, err, tc.want)
			}
		}
	})
	t.Run("STATE has a config", func(t *testing.T) {
		vol := noCloudVolume(t, "vfat", "CIDATA", valid)
		dev, state, firstBoot, err := run(sysBlock(vol), []byte("kept"))
		if err != nil || dev != "" || read(state) != "kept" || read(firstBoot) != "" {
			t.Errorf("noCloudFirstBoot with a config on STATE = %q, %v, config %q, first boot %q; want nothing done", dev, err, read(state), read(firstBoot))
		}
	})
	t.Run("invalid config", func(t *testing.T) {
		vol := noCloudVolume(t, "vfat", "CIDATA", invalid)
		dev, state, firstBoot, err := run(sysBlock(vol), nil)
		if err == nil || !strings.Contains(err.Error(), "user-data") || !strings.Contains(err.Error(), "machine.hostname") || dev != "" {
			t.Errorf("noCloudFirstBoot of an invalid config = %q, %v; want an error naming user-data and machine.hostname", dev, err)
		}
		if read(state) != "" || read(firstBoot) != "" {
			t.Error("an invalid config was written to STATE")
		}
	})
	t.Run("no volume", func(t *testing.T) {
		_, state, _, err := run(sysBlock(other), nil)
		if err == nil || !strings.Contains(err.Error(), "no filesystem is labelled CIDATA") || read(state) != "" {
			t.Errorf("noCloudFirstBoot without a volume = %v, STATE %q; want an error naming CIDATA", err, read(state))
		}
	})
}
