//go:build e2e

package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReproducibleBuild builds the same config three times, in different
// directories and at different times: cold (--no-cache), then twice with
// the cache, the last taking its boot parts from it; and wants the same
// bytes for every output and the same manifest, and a UKI of at most 50 MB
// with everything in it (make bench-build shows where its bytes are).
func TestReproducibleBuild(t *testing.T) {
	cfgDir := t.TempDir()
	cairn(t, "config", "gen", "--out", cfgDir, "--hostname", "repro")
	config := filepath.Join(cfgDir, "machine.yaml")
	build := func(dir string, args ...string) string {
		return cairn(t, append([]string{"image", "build", "-c", config, "-o", filepath.Join(dir, "node.qcow2"), "--format", "qcow2", "--assets", binDir}, args...)...)
	}
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	if out := build(a, "--no-cache"); strings.Contains(out, "from the cache") {
		t.Errorf("a --no-cache build took boot parts from the cache:\n%s", out)
	}
	time.Sleep(1100 * time.Millisecond) // a different second for every timestamp
	build(b)
	if out := build(c); !strings.Contains(out, "boot parts from the cache") {
		t.Errorf("a build with nothing changed did not take its boot parts from the cache:\n%s", out)
	}
	for _, dir := range []string{b, c} {
		for _, name := range []string{"node.qcow2", "manifest.json"} {
			ha, hb := sha(t, filepath.Join(a, name)), sha(t, filepath.Join(dir, name))
			if ha != hb {
				t.Errorf("%s differs between a cold build and one with the cache: %s vs %s", name, ha, hb)
			}
		}
	}
	manifest, _ := os.ReadFile(filepath.Join(a, "manifest.json"))
	for _, want := range []string{"kernel-package", "machine-config", "uki", "initramfs", "rootfs.sqsh", "node.qcow2"} {
		if !bytes.Contains(manifest, []byte(`"`+want+`"`)) {
			t.Errorf("manifest.json lacks %q:\n%s", want, manifest)
		}
	}
	const maxUKI = 50_000_000
	if size := artifactSize(t, manifest, "uki"); size > maxUKI {
		t.Errorf("the UKI is %d bytes, over its budget of %d", size, maxUKI)
	} else {
		t.Logf("the UKI is %d bytes (budget %d)", size, maxUKI)
	}
}

// TestInvalidConfigWritesNothing wants `image build` and `config validate`
// to fail on a bad config, list every error with its path, and write
// nothing.
func TestInvalidConfigWritesNothing(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte(`apiVersion: cairn.dev/v1alpha1
kind: MachineConfig
machine:
  hostname: Not_A_Hostname
network:
  interfaces:
    - name: eth0
      addresses: ["10.0.0.1/24", "10.0.0.300/24"]
`), 0o600)
	out := filepath.Join(dir, "out")
	for _, args := range [][]string{
		{"image", "build", "-c", bad, "-o", filepath.Join(out, "node.raw"), "--assets", binDir},
		{"config", "validate", bad},
	} {
		cmd := exec.Command(filepath.Join(binDir, "cairn"), args...)
		msg, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("cairn %s succeeded on an invalid config", strings.Join(args[:2], " "))
		}
		for _, want := range []string{"machine.hostname", `network.interfaces[0].addresses[1]: "10.0.0.300/24"`, "machine.api"} {
			if !strings.Contains(string(msg), want) {
				t.Errorf("cairn %s output lacks %q:\n%s", strings.Join(args[:2], " "), want, msg)
			}
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		entries, _ := os.ReadDir(out)
		t.Errorf("image build with an invalid config left %s behind: %v", out, entries)
	}
}

func sha(t *testing.T, path string) string {
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
