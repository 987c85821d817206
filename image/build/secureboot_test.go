package build

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/internal/authenticode"
	"github.com/cairn-os/cairn/internal/version"
)

// TestBuildSecureBoot builds with Secure Boot keys: the ESP's
// systemd-boot and UKI verify against the db certificate (as the firmware
// checks them), the ESP carries the signed key updates for systemd-boot
// to enroll, the UKI alone (--uki) is the signed one, two builds are the
// same bytes, and keys that are missing are named.
func TestBuildSecureBoot(t *testing.T) {
	needBuildTools(t)
	cache, assets, config := testCache(t), fakeAssets(t, ""), machineConfig(t)
	keys, err := image.GenerateSecureBootKeys(filepath.Join(t.TempDir(), "keys"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := image.GenerateSecureBootKeys(string(keys)); err == nil || !strings.Contains(err.Error(), "never overwritten") {
		t.Errorf("GenerateSecureBootKeys over keys: %v, want them kept", err)
	}
	build := func(uki, noCache bool) string {
		t.Helper()
		out := filepath.Join(t.TempDir(), "node.raw")
		if _, err := Build(context.Background(), Options{Config: config, Output: out, Assets: assets, Size: testSize,
			CacheDir: cache, NoCache: noCache, UKI: uki, SecureBoot: keys}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	disk, again := build(false, true), build(false, false)
	if fileSHA(t, disk) != fileSHA(t, again) {
		out, _ := exec.Command("cmp", "-l", disk, again).CombinedOutput()
		t.Errorf("two signed builds differ:\n%.2000s", out)
	}
	esp := filepath.Join(t.TempDir(), "esp.img")
	if out, err := exec.Command("dd", "if="+disk, "of="+esp, "bs=1M", "skip=1", "count=256", "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v\n%s", err, out)
	}
	read := func(path string) []byte {
		t.Helper()
		out, err := exec.Command("mtype", "-i", esp, "::"+path).Output()
		if err != nil {
			t.Fatalf("mtype %s: %v", path, err)
		}
		return out
	}
	pemData, err := os.ReadFile(filepath.Join(string(keys), "db.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemData)
	db, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	uki := read("/EFI/Linux/cairn-" + version.Version + ".efi")
	for name, data := range map[string][]byte{"systemd-boot": read("/EFI/BOOT/BOOTX64.EFI"), "the UKI": uki} {
		if _, err := authenticode.Verify(bytes.NewReader(data), int64(len(data)), []*x509.Certificate{db}); err != nil {
			t.Errorf("%s on the ESP: %v, want it signed by db", name, err)
		}
	}
	if conf := string(read("/loader/loader.conf")); !strings.Contains(conf, "secure-boot-enroll force\n") {
		t.Errorf("loader.conf = %q, want secure-boot-enroll force", conf)
	}
	for _, n := range []string{"db", "KEK", "PK"} {
		if auth := read("/loader/keys/auto/" + n + ".auth"); len(auth) < 1000 {
			t.Errorf("loader/keys/auto/%s.auth: %d bytes, want a signed variable update", n, len(auth))
		}
	}
	if alone, err := os.ReadFile(build(true, false)); err != nil || !bytes.Equal(alone, uki) {
		t.Errorf("the UKI alone (%v) is not the ESP's signed UKI", err)
	}

	if err := os.Remove(filepath.Join(string(keys), "KEK.key")); err != nil {
		t.Fatal(err)
	}
	_, err = Build(context.Background(), Options{Config: config, Output: filepath.Join(t.TempDir(), "node.raw"), Assets: assets, CacheDir: cache, SecureBoot: keys})
	if err == nil || !strings.Contains(err.Error(), "KEK.key") || !strings.Contains(err.Error(), "config gen --secure-boot") {
		t.Errorf("Build without KEK.key: %v, want it named, with what makes it", err)
	}
}
