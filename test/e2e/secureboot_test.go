//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/qemu"
)

// TestSecureBoot builds an image signed with keys from `config gen
// --secure-boot` and boots it with OVMF's Secure Boot firmware on a new
// variable store: systemd-boot enrolls the keys, the node boots with
// Secure Boot enforced and says so. Then one byte of the UKI on the disk
// changes, and the firmware refuses to load it.
func TestSecureBoot(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	out := cairn(t, "config", "gen", "--out", dir, "--hostname", "signed-node", "--endpoint", endpoint, "--secure-boot")
	keys := filepath.Join(dir, "secureboot")
	if !strings.Contains(out, "--secure-boot "+keys) {
		t.Errorf("config gen says:\n%s\nwant the next step with --secure-boot %s", out, keys)
	}
	disk := filepath.Join(dir, "node.raw")
	cairn(t, "image", "build", "-c", filepath.Join(dir, "machine.yaml"), "-o", disk, "--assets", binDir, "--secure-boot", keys)
	c, _ := dialNode(t, dir, endpoint)

	vm := bootVM(t, qemu.Options{Disk: disk, APIPort: port, SecureBoot: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	if err := vm.WaitReady(ctx, "the API of the signed image", apiReady(c), nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API ready %s after QEMU started, the keys enrolled (accel %s)", time.Since(start).Round(time.Second), vm.Accel())
	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !v.Boot.GetSecureBoot() {
		t.Errorf("Version().Boot = %v, want Secure Boot enforced", v.Boot)
	}
	log, err := os.ReadFile(vm.Opts.ConsoleLog)
	if err != nil {
		t.Fatal(err)
	}
	if want := `Enrolling secure boot keys from directory: \loader\keys\auto`; !bytes.Contains(log, []byte(want)) {
		t.Errorf("console log lacks %q:\n%s", want, log)
	}
	// An upgrade to a newer UKI that is not signed is refused before
	// anything is written: the firmware would not boot it.
	u := buildUpgradeUKIs(t, filepath.Join(dir, "machine.yaml"), v.CairnVersion)
	out, err = cairnCLI(ctx, "node", "--cairnconfig", filepath.Join(dir, "cairnconfig"), "upgrade", "--image", u.good)
	if err == nil || !strings.Contains(out, "not signed") || !strings.Contains(out, "nothing written") {
		t.Errorf("upgrade to an unsigned UKI: %v\n%s\nwant it refused, not signed", err, out)
	}
	if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-vm.Done():
	case <-ctx.Done():
		t.Fatal("the node did not power off")
	}

	// One byte of the UKI's os-release, in the EFI system partition.
	tamperESP(t, disk, []byte(`PRETTY_NAME="Cairn`))
	vm = bootVM(t, qemu.Options{Disk: disk, APIPort: port, SecureBoot: true, EFIVars: vm.Opts.EFIVars})
	refused := `Error loading \EFI\Linux\cairn-`
	err = vm.WaitReady(ctx, "the firmware refusing the changed UKI", func(context.Context) error {
		log, err := os.ReadFile(vm.Opts.ConsoleLog)
		if err != nil {
			return err
		}
		if i := bytes.Index(log, []byte(refused)); i >= 0 && bytes.Contains(log[i:], []byte("Access Denied")) {
			return nil
		}
		return errors.New("not on the console yet")
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	vm.Kill()
}

// tamperESP changes the first byte of the first occurrence of marker in
// the EFI system partition of the raw disk (1 MiB to 257 MiB).
func tamperESP(t *testing.T, disk string, marker []byte) {
	t.Helper()
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const start, size = 1 << 20, 256 << 20
	esp := make([]byte, size)
	if _, err := f.ReadAt(esp, start); err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(esp, marker)
	if i < 0 {
		t.Fatalf("%q not in the EFI system partition", marker)
	}
	if _, err := f.WriteAt([]byte{marker[0] ^ 0x20}, int64(start+i)); err != nil {
		t.Fatal(err)
	}
}
