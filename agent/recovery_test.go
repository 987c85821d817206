package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/machineconfig"
)

func TestLoadConfigRecovery(t *testing.T) {
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "node-1", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	b.Config.Cluster = &machineconfig.Cluster{Server: "https://10.0.2.2:6443"}
	good, err := b.Config.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// An unknown field: the API is served with the file's credentials, the
	// cluster section (and so the kubelet part) is left out.
	cfg, err := loadConfig(write("unknown.yaml", append(good, "futureField: 1\n"...)))
	if err != nil {
		t.Fatalf("loadConfig(unknown field) = %v, want the recovered config", err)
	}
	if cfg.Machine.API.Cert != b.Config.Machine.API.Cert || cfg.Machine.Hostname != "node-1" || cfg.Cluster != nil {
		t.Errorf("loadConfig(unknown field) = hostname %q, same cert %v, cluster %v; want node-1's API and no cluster",
			cfg.Machine.Hostname, cfg.Machine.API.Cert == b.Config.Machine.API.Cert, cfg.Cluster)
	}

	// Cut in the middle of the key: nothing to serve the API with.
	cut := good[:strings.Index(string(good), "PRIVATE KEY")]
	if _, err := loadConfig(write("cut.yaml", cut)); err == nil || !strings.Contains(err.Error(), "no usable machine.api credentials") {
		t.Errorf("loadConfig(truncated) error = %v, want it to say there are no usable credentials", err)
	}
}
