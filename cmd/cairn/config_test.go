package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runConfig runs `cairn config args...` in-process and returns its output.
func runConfig(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := configCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage = true
	err := cmd.Execute()
	return out.String(), err
}

func TestConfigValidateInvalid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	bad := `apiVersion: cairn.dev/v1alpha1
kind: MachineConfig
machine:
  api:
    port: 70000
network:
  interfaces:
    - name: eth0
      mac: "52:54:00:12:34:56"
      addresses: ["10.0.2.15/24", "10.0.0.300/24"]
  nameservers: [dns]
`
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := runConfig(t, "validate", path)
	if err == nil {
		t.Fatalf("config validate %s = nil error, want the problems listed", path)
	}
	for _, want := range []string{
		path + ":",
		"\n  machine.hostname: required",
		"\n  machine.api.port: 70000 is out of range",
		"\n  machine.api.ca: required",
		"\n  machine.api.cert: required",
		"\n  machine.api.key: required",
		"\n  network.interfaces[0]: set exactly one of name or mac",
		"\n  network.interfaces[0].addresses[1]: ",
		"\n  network.nameservers[0]: ",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("config validate %s = %q, want it to contain %q", path, err, want)
		}
	}
}

func TestConfigGenValidate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	out, err := runConfig(t, "gen", "--out", dir, "--hostname", "node-1",
		"--address", "10.0.2.15/24", "--gateway", "10.0.2.2", "--nameserver", "10.0.2.3",
		"--endpoint", "10.0.2.15:50000")
	if err != nil {
		t.Fatalf("config gen = %v, output:\n%s", err, out)
	}
	machineYAML := filepath.Join(dir, "machine.yaml")
	for _, want := range []string{
		"wrote " + machineYAML,
		"wrote " + filepath.Join(dir, "cairnconfig"),
		"next: cairn image build -c " + machineYAML,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("config gen printed:\n%s\nwant it to contain %q", out, want)
		}
	}

	out, err = runConfig(t, "validate", machineYAML)
	if err != nil {
		t.Fatalf("config validate %s = %v", machineYAML, err)
	}
	if want := machineYAML + ": valid\n"; out != want {
		t.Errorf("config validate printed %q, want %q", out, want)
	}

	_, err = runConfig(t, "gen", "--out", dir)
	if err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("config gen over existing files = %v, want an error suggesting --force", err)
	}
	if out, err := runConfig(t, "gen", "--out", dir, "--force"); err != nil {
		t.Errorf("config gen --force = %v, output:\n%s", err, out)
	}
}

// TestConfigValidateStaticPods wants validate to check a static pod in
// full, Pod API and all, not only what init reads of it.
func TestConfigValidateStaticPods(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	if out, err := runConfig(t, "gen", "--out", dir, "--hostname", "node-1"); err != nil {
		t.Fatalf("config gen = %v, output:\n%s", err, out)
	}
	machineYAML := filepath.Join(dir, "machine.yaml")
	gen, err := os.ReadFile(machineYAML)
	if err != nil {
		t.Fatal(err)
	}
	withPods := func(container string) {
		t.Helper()
		pods := "machine:\n  staticPods:\n    - {apiVersion: v1, kind: Pod, metadata: {name: web}, spec: {containers: [" + container + "]}}\n"
		data := strings.Replace(string(gen), "machine:\n", pods, 1)
		if err := os.WriteFile(machineYAML, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	withPods("{name: web, image: registry.example/web:1.0}")
	if out, err := runConfig(t, "validate", machineYAML); err != nil || out != machineYAML+": valid\n" {
		t.Fatalf("config validate (valid static pod) = %q, %v; want it valid", out, err)
	}
	withPods("{name: web}")
	_, err = runConfig(t, "validate", machineYAML)
	if want := "\n  machine.staticPods[0].spec.containers[0].image: required"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("config validate (container without image) = %v, want it to contain %q", err, want)
	}
}
