package containerdconfig

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/machineconfig"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestFilesGolden(t *testing.T) {
	cfg := &machineconfig.Config{Containerd: machineconfig.Containerd{Registries: []machineconfig.Registry{
		{Host: "10.0.2.2:5000", Endpoints: []string{"http://10.0.2.2:5000"}},
		{Host: "docker.io", Endpoints: []string{"https://mirror.example", "https://registry-1.docker.io"}, InsecureSkipVerify: true},
	}}}
	files := Files(cfg)
	want := []string{Node.HostsDir + "/10.0.2.2:5000/hosts.toml", Node.HostsDir + "/docker.io/hosts.toml", layout.ContainerdConfig}
	if diff := cmp.Diff(want, SortedPaths(files)); diff != "" {
		t.Fatalf("Files() paths (-want +got):\n%s", diff)
	}
	for _, p := range want {
		golden := filepath.Join("testdata", strings.NewReplacer("/", "_", ":", "_").Replace(strings.TrimPrefix(p, "/")))
		if *update {
			os.WriteFile(golden, files[p], 0o644)
		}
		raw, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(raw), string(files[p])); diff != "" {
			t.Errorf("%s differs from %s (-want +got):\n%s", p, golden, diff)
		}
	}
}
