package stage2

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-os/cairn/machineconfig"
)

// TestLoadConfig hands the machine config on to the later steps: STATE's
// when it loads; else what recovery mode salvages from it, with the load
// error kept for the control socket; and with no credentials salvaged, no
// services start.
func TestLoadConfig(t *testing.T) {
	good := generatedDoc(t)
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	n := newNode(system{}, nil)
	conf, err := n.loadConfig(write("good.yaml", good))
	if err != nil || conf.recovery != nil || conf.Machine.Hostname != "node-1" || n.loadErr != nil {
		t.Errorf("loadConfig(valid) = %+v, %v (load error %v); want node-1's config, not in recovery", conf, err, n.loadErr)
	}

	n = newNode(system{}, nil)
	conf, err = n.loadConfig(write("future.yaml", append([]byte("futureField: 1\n"), good...)))
	if err == nil || !strings.Contains(err.Error(), "futureField") || !strings.Contains(err.Error(), "recovery mode") {
		t.Errorf("loadConfig(unknown field) = %v, want the field named and recovery mode said", err)
	}
	if conf.recovery == nil || !conf.recovery.API || conf.Machine.Hostname != "node-1" {
		t.Errorf("loadConfig(unknown field) = %+v, want recovery with node-1's hostname and API credentials", conf)
	}
	if n.loadErr == nil || !strings.Contains(n.loadErr.Error(), "futureField") {
		t.Errorf("load error for the control socket = %v, want the unknown field", n.loadErr)
	}

	n = newNode(system{}, nil)
	conf, err = n.loadConfig(filepath.Join(dir, "missing.yaml"))
	if err == nil || conf.recovery == nil || conf.recovery.API || conf.Machine.Hostname != machineconfig.RecoveryHostname {
		t.Errorf("loadConfig(missing) = %+v, %v; want recovery as %s without credentials", conf, err, machineconfig.RecoveryHostname)
	}
	if err := n.startNodeServices(conf, nil); err == nil || !strings.Contains(err.Error(), "none started in recovery mode") {
		t.Errorf("startNodeServices(recovery without credentials) = %v, want none started", err)
	}
	if n.services != nil {
		t.Error("a supervisor was made in recovery mode without credentials")
	}
}

// generatedDoc is a valid machine config for node-1, as cairn config gen
// writes it.
func generatedDoc(t *testing.T) []byte {
	t.Helper()
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := b.Config.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return doc
}
