package stage2

import (
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestApplySysctls sets sysctls of a network namespace of the test's own:
// only those that differ, a vector whatever its spacing, and the one the
// kernel does not have named while the others are set.
func TestApplySysctls(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWNET) {
		return
	}
	read := func(name string) string {
		t.Helper()
		data, err := os.ReadFile(procSys + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(string(data)), " ")
	}
	sysctls := map[string]string{
		"net.ipv4.ip_default_ttl":       "42",
		"net.ipv4.ip_local_port_range":  "40000  50000",
		"net/ipv4/conf/lo/accept_local": "1",
		"net.ipv4.tcp_keepalive_time":   read("net/ipv4/tcp_keepalive_time"), // already so
	}
	set, err := applySysctls(procSys, sysctls)
	if err != nil {
		t.Fatalf("applySysctls() = %v", err)
	}
	if diff := cmp.Diff([]string{"net.ipv4.ip_default_ttl", "net.ipv4.ip_local_port_range", "net/ipv4/conf/lo/accept_local"}, slices.Sorted(maps.Keys(set))); diff != "" {
		t.Errorf("applySysctls() set (-want +got):\n%s", diff)
	}
	for path, want := range map[string]string{
		"net/ipv4/ip_default_ttl":       "42",
		"net/ipv4/ip_local_port_range":  "40000 50000",
		"net/ipv4/conf/lo/accept_local": "1",
	} {
		if got := read(path); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	if set, err := applySysctls(procSys, sysctls); err != nil || len(set) != 0 {
		t.Errorf("applySysctls() again = %v, %v; want nothing set", set, err)
	}

	set, err = applySysctls(procSys, map[string]string{"net.ipv4.no_such_parameter": "1", "net.ipv4.ip_default_ttl": "43", "net.ipv4.ip_forward": "x"})
	for _, want := range []string{
		"sysctl net.ipv4.no_such_parameter (machine.sysctls): this kernel has no /proc/sys/net/ipv4/no_such_parameter",
		`sysctl net.ipv4.ip_forward = "x" (machine.sysctls): `,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("applySysctls(unknown, refused) = %v, want it to contain %q", err, want)
		}
	}
	if !cmp.Equal(set, map[string]string{"net.ipv4.ip_default_ttl": "42"}) || read("net/ipv4/ip_default_ttl") != "43" {
		t.Errorf("applySysctls() with errors set %v, want the valid one set all the same, from 42", set)
	}
}

// TestBootSequenceAppliesConfig wants the sysctls set and the files
// written once the config is loaded, the sysctls before the network, the
// files before the services.
func TestBootSequenceAppliesConfig(t *testing.T) {
	at := map[string]int{}
	for i, s := range newNode(system{}, nil).bootSequence().Steps {
		at[s.Name] = i + 1
	}
	for _, order := range [][2]string{
		{"mount STATE", "find a first-boot config"},
		{"find a first-boot config", "load machine config"},
		{"load machine config", "set sysctls"},
		{"set sysctls", "configure network"},
		{"configure network", "fetch the first-boot config"},
		{"fetch the first-boot config", "maintenance mode"},
		{"maintenance mode", "start services"},
		{"prepare EPHEMERAL", "write machine files"},
		{"load machine config", "write machine files"},
		{"write machine files", "start services"},
	} {
		if a, b := at[order[0]], at[order[1]]; a == 0 || b == 0 || a > b {
			t.Errorf("boot steps %q (%d) and %q (%d): want both, in this order", order[0], a, order[1], b)
		}
	}
}
