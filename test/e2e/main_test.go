//go:build e2e

// Package e2e builds Cairn images and boots them in QEMU, driving the node
// only through its API. Run with `go test -tags e2e ./test/e2e/` (as root,
// with the Debian packages of hack/deps.sh).
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/qemu"
)

// binDir holds cairn, init and cairn-agent built for this test run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cairn-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = filepath.Join(dir, "bin")
	code := 1
	if err := buildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildBinaries builds cairn, the node binaries and the components into
// dir/bin with `make build`, the one recipe for them.
func buildBinaries(dir string) error {
	cmd := exec.Command("make", "--no-print-directory", "build", "OUT="+dir)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make build: %v\n%s", err, out)
	}
	return nil
}

// cairnCLI runs the cairn CLI and returns its combined output and error.
func cairnCLI(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "cairn"), args...).CombinedOutput()
	return string(out), err
}

// apiReady is a readiness check of the node's API through c: one Version
// call, bounded, since QEMU accepts connections on the forwarded port
// while the node reboots.
func apiReady(c *client.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := c.Version(ctx, &machine.VersionRequest{})
		return err
	}
}

// roleConfig writes a client config for the node of the config files in
// dir (cairn config gen's) whose certificate has role, and returns it.
func roleConfig(t testing.TB, dir, role string) string {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(dir, machineconfig.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, machineconfig.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := machineconfig.LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := machineconfig.LoadClientConfig(filepath.Join(dir, machineconfig.ClientConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.IssueClient("e2e-"+role, role, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cc.Cert, cc.Key = string(cert), string(key)
	path := filepath.Join(t.TempDir(), "cairnconfig-"+role)
	if err := cc.Write(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// cairn runs the cairn CLI and returns its combined output.
func cairn(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "cairn"), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cairn %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// freePort returns a TCP port free on 127.0.0.1 right now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// artifactSize returns the size of the named artifact in a manifest.
func artifactSize(t testing.TB, manifest []byte, name string) int64 {
	t.Helper()
	var m struct {
		Outputs []struct {
			Name string
			Size int64
		}
	}
	if err := json.Unmarshal(manifest, &m); err != nil {
		t.Fatal(err)
	}
	for _, a := range m.Outputs {
		if a.Name == name {
			return a.Size
		}
	}
	t.Fatalf("manifest has no output %q", name)
	return 0
}

// dialNode connects to the node at endpoint with the client config that
// `cairn config gen` wrote in dir; the connection closes with the test.
func dialNode(t testing.TB, dir, endpoint string) (*client.Client, *machineconfig.ClientConfig) {
	t.Helper()
	cc, err := machineconfig.LoadClientConfig(filepath.Join(dir, "cairnconfig"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(cc, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, cc
}

// bootVM starts a VM with o; when the test ends QEMU is stopped if it
// still runs, and a failed test logs the console. A fallback from KVM to
// TCG is logged.
func bootVM(t testing.TB, o qemu.Options) *qemu.VM {
	t.Helper()
	o.Notify = func(line string) { t.Log(line) }
	vm, err := qemu.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-vm.Done():
		default:
			vm.Kill()
		}
		if t.Failed() {
			log, _ := os.ReadFile(vm.Opts.ConsoleLog)
			t.Logf("console log:\n%s", log)
		}
	})
	return vm
}
