package machineconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRecover(t *testing.T) {
	b, err := Generate(GenerateOptions{Hostname: "node-1", Interface: "eth0", Addresses: []string{"10.0.2.15/24"}, Gateway: "10.0.2.2", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	b.Config.Services = []Service{{Name: "hello", Image: "example.com/hello:v1"}}
	good, err := b.Config.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// replace changes one line of the good document.
	replace := func(old, new string) []byte {
		if !strings.Contains(string(good), old) {
			t.Fatalf("generated config lacks %q:\n%s", old, good)
		}
		return []byte(strings.Replace(string(good), old, new, 1))
	}
	defaultNet := Network{Interfaces: []Interface{{DHCP: true}}}
	all := []string{"machine.hostname", "machine.api", "network"}
	for _, tc := range []struct {
		name     string
		data     []byte
		salvaged []string
		hostname string
		api      bool
		network  Network
	}{
		{"unknown top-level field keeps everything", append(append([]byte(nil), good...), "futureField: true\n"...), all, "node-1", true, b.Config.Network},
		{"unknown field in machine keeps everything", replace("hostname: node-1", "hostname: node-1\n  futureField: 1"), all, "node-1", true, b.Config.Network},
		{"wrong type in services keeps the rest", replace("name: hello", "name: [1, 2]"), all, "node-1", true, b.Config.Network},
		{"bad hostname falls back", replace("hostname: node-1", "hostname: Not_A_Host"), []string{"machine.api", "network"}, RecoveryHostname, true, b.Config.Network},
		{"bad address falls back to DHCP", replace("10.0.2.15/24", "10.0.2.999/24"), []string{"machine.hostname", "machine.api"}, "node-1", true, defaultNet},
		{"no key, no API", replace("  key: |", "  notkey: |"), []string{"machine.hostname", "network"}, "node-1", false, b.Config.Network},
		{"not YAML", []byte("\x00\x01 {[ garbage"), nil, RecoveryHostname, false, defaultNet},
		{"empty", nil, nil, RecoveryHostname, false, defaultNet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Recover(tc.data)
			if diff := cmp.Diff(tc.salvaged, r.Salvaged); diff != "" {
				t.Errorf("Recover().Salvaged (-want +got):\n%s", diff)
			}
			if r.Config.Machine.Hostname != tc.hostname {
				t.Errorf("Recover().Config.Machine.Hostname = %q, want %q", r.Config.Machine.Hostname, tc.hostname)
			}
			if diff := cmp.Diff(tc.network, r.Config.Network); diff != "" {
				t.Errorf("Recover().Config.Network (-want +got):\n%s", diff)
			}
			if r.API != tc.api {
				t.Errorf("Recover().API = %v, want %v", r.API, tc.api)
			}
			err := r.Config.Validate()
			switch {
			case tc.api && err != nil:
				t.Errorf("Recover().Config.Validate() = %v, want a valid config when the API is usable", err)
			case !tc.api && (err == nil || problemsUnder(err, "machine.hostname") || problemsUnder(err, "network")):
				t.Errorf("Recover().Config.Validate() = %v, want problems under machine.api only", err)
			}
			if r.API {
				if _, err := r.Config.Machine.API.TLSConfig(); err != nil {
					t.Errorf("recovered API.TLSConfig() = %v, want the credentials usable", err)
				}
			}
			if r.Config.Cluster != nil || len(r.Config.Services) != 0 {
				t.Errorf("Recover() kept cluster %v and services %v, want neither", r.Config.Cluster, r.Config.Services)
			}
		})
	}
}

func TestRecoverFile(t *testing.T) {
	r, err := RecoverFile(filepath.Join(t.TempDir(), "missing.yaml"))
	if !os.IsNotExist(err) && (err == nil || !strings.Contains(err.Error(), "read machine config")) {
		t.Errorf("RecoverFile(missing) error = %v, want a read error", err)
	}
	if r == nil || r.API || r.Config.Machine.Hostname != RecoveryHostname {
		t.Errorf("RecoverFile(missing) = %+v, want the defaults without an API", r)
	}
	if got := r.String(); !strings.Contains(got, "no management API") || !strings.Contains(got, "taken from the damaged config: nothing") {
		t.Errorf("Recovery.String() = %q, want it to say there is no API and nothing was taken", got)
	}
}
