package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/google/go-cmp/cmp"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"
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

// genConfig runs `cairn config gen` into a temporary directory and returns
// the machine config's path.
func genConfig(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "out")
	if out, err := runConfig(t, "gen", "--out", dir, "--hostname", "node-1", "--nameserver", "10.0.2.3"); err != nil {
		t.Fatalf("config gen = %v, output:\n%s", err, out)
	}
	return filepath.Join(dir, "machine.yaml")
}

// TestConfigSchema checks `cairn config gen`'s config against the schema
// `cairn config schema` prints, with a JSON Schema validator, and a config
// of the wrong shape refused by it.
func TestConfigSchema(t *testing.T) {
	schema, err := runConfig(t, "schema")
	if err != nil {
		t.Fatalf("config schema = %v", err)
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("config schema printed what is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("machine-config.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("machine-config.json")
	if err != nil {
		t.Fatalf("compile the schema: %v", err)
	}
	check := func(data []byte) error {
		j, err := yaml.YAMLToJSON(data)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
		if err != nil {
			t.Fatal(err)
		}
		return s.Validate(inst)
	}
	gen, err := os.ReadFile(genConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := check(gen); err != nil {
		t.Errorf("config gen's config does not match the schema: %v", err)
	}
	bad := strings.Replace(string(gen), "hostname: node-1", "hostname: node-1\n  hostnme: node-1", 1)
	if err := check([]byte(bad)); err == nil || !strings.Contains(err.Error(), "hostnme") {
		t.Errorf("the schema's verdict on an unknown field = %v, want it named", err)
	}
}

func TestConfigPatchDiff(t *testing.T) {
	machineYAML := genConfig(t)
	dir := filepath.Dir(machineYAML)
	ops := filepath.Join(dir, "ops.yaml")
	if err := os.WriteFile(ops, []byte("- {op: replace, path: /machine/hostname, value: node-2}\n- {op: add, path: /network/nameservers/-, value: 10.0.2.4}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	patched := filepath.Join(dir, "patched.yaml")
	out, err := runConfig(t, "patch", machineYAML, "--patch", ops,
		"--patch", `machine: {sysctls: {vm.swappiness: "10"}, files: [{path: /etc/motd, content: "hi\n"}]}`, "-o", patched)
	if err != nil || out != "" {
		t.Fatalf("config patch -o = %q, %v; want it quiet", out, err)
	}
	if fi, err := os.Stat(patched); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("patched config: %v, %v; want a 0600 file", fi, err)
	}
	if out, err := runConfig(t, "validate", patched); err != nil {
		t.Fatalf("config validate (patched) = %q, %v", out, err)
	}
	// Without -o the result is printed, as the node reads it: a YAML
	// octal mode is the octal string again.
	out, err = runConfig(t, "patch", patched, "--patch", `machine: {files: [{path: /etc/motd, mode: 0640}]}`)
	if err != nil {
		t.Fatalf("config patch = %v", err)
	}
	if c, err := machineconfig.Parse([]byte(out)); err != nil || c.Machine.Hostname != "node-2" || c.Machine.Files[0].Mode != 0o640 || !strings.Contains(out, `mode: "0640"`) {
		t.Errorf("config patch printed a config (%v) that is not node-2's with /etc/motd 0640:\n%s", err, out)
	}

	out, err = runConfig(t, "diff", machineYAML, patched)
	if err != nil {
		t.Fatalf("config diff = %v", err)
	}
	want := `machine.hostname: "node-1" → "node-2"
machine.sysctls["vm.swappiness"]: added "10"
machine.files[0]: added {"content":"hi\n","mode":"0644","owner":"0:0","path":"/etc/motd"}
network.nameservers[1]: added "10.0.2.4"
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("config diff (-want +got):\n%s", diff)
	}
	if out, err := runConfig(t, "diff", patched, patched); err != nil || out != "no change\n" {
		t.Errorf("config diff of a file with itself = %q, %v; want no change", out, err)
	}

	// An invalid result: every problem with its path, and nothing written.
	before, err := os.ReadFile(patched)
	if err != nil {
		t.Fatal(err)
	}
	_, err = runConfig(t, "patch", patched, "--patch", `{"machine": {"hostname": "Bad_Name", "files": [{"path": "/usr/x"}], "sysctls": {"kernel.hostname": "x"}}}`, "-o", patched)
	for _, want := range []string{
		"nothing written: the patched config: invalid machine config:",
		"\n  machine.hostname: ",
		"\n  machine.sysctls[\"kernel.hostname\"]: ",
		"\n  machine.files[0].path: ",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config patch (invalid result) = %v, want it to contain %q", err, want)
		}
	}
	_, err = runConfig(t, "patch", patched, "--patch", "[{op: remove, path: /machine/nothing}]", "-o", patched)
	if err == nil || !strings.Contains(err.Error(), "nothing written: --patch 1: JSON patch operation 0 (remove /machine/nothing)") {
		t.Errorf("config patch (failing operation) = %v, want the patch and operation named", err)
	}
	if after, err := os.ReadFile(patched); err != nil || !bytes.Equal(after, before) {
		t.Errorf("a refused patch changed %s (%v)", patched, err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}
