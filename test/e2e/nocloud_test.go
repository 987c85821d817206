//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/qemu"
)

// TestNoCloud boots a generic image (`image build --generic`: no machine
// config on STATE) with a NoCloud volume from `image cidata` attached,
// and wants the node up on the volume's config: its API answers the
// config's credentials with the config's hostname, the boot's first-boot
// step succeeded, and the console says where the config came from.
func TestNoCloud(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	cairn(t, "config", "gen", "--out", dir, "--hostname", "nocloud-node", "--endpoint", endpoint)
	disk, cidata := filepath.Join(dir, "generic.raw"), filepath.Join(dir, "cidata.img")
	cairn(t, "image", "build", "--generic", "-o", disk, "--assets", binDir)
	cairn(t, "image", "cidata", "-c", filepath.Join(dir, "machine.yaml"), "-o", cidata)
	c, _ := dialNode(t, dir, endpoint)

	vm := bootVM(t, qemu.Options{Disk: disk, APIPort: port, Attach: []string{cidata}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	if err := vm.WaitReady(ctx, "the API on the NoCloud volume's config", apiReady(c), nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API ready %s after QEMU started (accel %s)", time.Since(start).Round(time.Second), vm.Accel())
	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Hostname != "nocloud-node" {
		t.Errorf("Version().Hostname = %q, want nocloud-node, the NoCloud volume's", v.Hostname)
	}
	for _, name := range []string{"find a first-boot config", "load machine config"} {
		if s := step(v.BootTimeline, name); s == nil || s.Error != "" {
			t.Errorf("boot step %q = %v, want it done without error", name, s)
		}
	}
	log, err := os.ReadFile(vm.Opts.ConsoleLog)
	if err != nil {
		t.Fatal(err)
	}
	if want := "machine config from a NoCloud volume, written to STATE device=/dev/vdb"; !strings.Contains(string(log), want) {
		t.Errorf("console log lacks %q:\n%s", want, log)
	}
}

// TestConfigURL boots a generic image built with the kernel arguments
// cairn.config.url (the host's HTTP server, 10.0.2.2 from the guest) and
// cairn.config.sha256, and wants the node to fetch its config at first
// boot, reboot on it, and answer its API with the config's hostname.
func TestConfigURL(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	cairn(t, "config", "gen", "--out", dir, "--hostname", "url-node", "--endpoint", endpoint)
	config, err := os.ReadFile(filepath.Join(dir, "machine.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.URL.Path != "/machine.yaml" {
			http.NotFound(w, r)
			return
		}
		w.Write(config)
	}))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(config)
	disk := filepath.Join(dir, "generic.raw")
	cairn(t, "image", "build", "--generic", "-o", disk, "--assets", binDir,
		"--kernel-arg", "cairn.config.url=http://10.0.2.2:"+u.Port()+"/machine.yaml",
		"--kernel-arg", "cairn.config.sha256="+hex.EncodeToString(sum[:]))
	c, _ := dialNode(t, dir, endpoint)

	vm := bootVM(t, qemu.Options{Disk: disk, APIPort: port})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	if err := vm.WaitReady(ctx, "the API on the config from cairn.config.url", apiReady(c), nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API ready %s after QEMU started, the config fetched and the node rebooted (accel %s)", time.Since(start).Round(time.Second), vm.Accel())
	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Hostname != "url-node" {
		t.Errorf("Version().Hostname = %q, want url-node, the fetched config's", v.Hostname)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("the config server had %d requests, want 1: fetched at the first boot only", n)
	}
	log, err := os.ReadFile(vm.Opts.ConsoleLog)
	if err != nil {
		t.Fatal(err)
	}
	if want := "machine config fetched, written to STATE: rebooting to boot on it"; !strings.Contains(string(log), want) {
		t.Errorf("console log lacks %q:\n%s", want, log)
	}
}

// TestMaintenance boots a generic image with no config anywhere, reads
// the fingerprint of its maintenance-mode certificate on the console, and
// applies a config with `node apply --insecure`: an invalid one is refused
// with its field path, then a valid one becomes the node's, which reboots
// and answers its API with the config's hostname.
func TestMaintenance(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	cairn(t, "config", "gen", "--out", dir, "--hostname", "maintained-node", "--endpoint", endpoint)
	disk := filepath.Join(dir, "generic.raw")
	cairn(t, "image", "build", "--generic", "-o", disk, "--assets", binDir)
	c, _ := dialNode(t, dir, endpoint)

	vm := bootVM(t, qemu.Options{Disk: disk, APIPort: port})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	fingerprintRE := regexp.MustCompile(`maintenance mode: .* fingerprint=([0-9a-f]{64})`)
	var fingerprint string
	err := vm.WaitReady(ctx, "the fingerprint of maintenance mode on the console", func(context.Context) error {
		log, err := os.ReadFile(vm.Opts.ConsoleLog)
		if err != nil {
			return err
		}
		m := fingerprintRE.FindSubmatch(log)
		if m == nil {
			return errors.New("not on the console yet")
		}
		fingerprint = string(m[1])
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("maintenance mode %s after QEMU started (accel %s), fingerprint %s", time.Since(start).Round(time.Second), vm.Accel(), fingerprint)

	invalid := filepath.Join(dir, "invalid.yaml")
	config, err := os.ReadFile(filepath.Join(dir, "machine.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(invalid, []byte(strings.Replace(string(config), "hostname: maintained-node", "hostname: Not_A_Hostname", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	apply := func(file string) (string, error) {
		return cairnCLI(ctx, "node", "apply", "--insecure", "--fingerprint", fingerprint, "-n", endpoint, "-f", file, "--mode", "reboot")
	}
	// The API port is forwarded before the node listens: try until it does.
	var out string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
		out, err = apply(invalid)
		if strings.Contains(out, "InvalidArgument") || time.Now().After(deadline) {
			break
		}
	}
	if err == nil || !strings.Contains(out, "machine.hostname") {
		t.Errorf("apply of an invalid config: %v\n%s\nwant it refused naming machine.hostname", err, out)
	}
	if out, err := apply(filepath.Join(dir, "machine.yaml")); err != nil || !strings.Contains(out, "rebooting") {
		t.Fatalf("apply of the config: %v\n%s", err, out)
	}
	if err := vm.WaitReady(ctx, "the API on the config applied in maintenance mode", apiReady(c), nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API ready %s after QEMU started (accel %s)", time.Since(start).Round(time.Second), vm.Accel())
	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Hostname != "maintained-node" {
		t.Errorf("Version().Hostname = %q, want maintained-node, the applied config's", v.Hostname)
	}
}
