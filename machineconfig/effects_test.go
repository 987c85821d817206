package machineconfig

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestEffect classifies changes by the longest rule that holds them; a
// field that no rule names, or a parent of a live field, needs a reboot.
func TestEffect(t *testing.T) {
	for path, want := range map[string]Effect{
		`machine.sysctls["net.ipv4.ip_forward"]`:                Live,
		"machine.sysctls":                                       Live,
		"machine.files[2].mode":                                 Live,
		"machine.staticPods[0].spec.containers[0].image":        Live,
		`cluster.nodeLabels["rack"]`:                            Live,
		"cluster.nodeTaints[0]":                                 Reboot,
		"cluster":                                               Reboot, // a cluster section added or removed
		"machine":                                               Reboot,
		"machine.hostname":                                      Reboot,
		"machine.sysctlsExtra":                                  Reboot, // a name that starts like a rule's is not below it
		"network.interfaces[0].addresses[1]":                    Live,
		"network.interfaces[12].vlans[0].dhcp":                  Live,
		"network.interfaces[0].dhcp":                            Reboot,
		"network.interfaces[0].name":                            Reboot,
		"network.interfaces[0].bond.mode":                       Reboot,
		"network.interfaces[x].mtu":                             Reboot, // not an index
		"network.interfaces[0]":                                 Reboot, // an interface added or removed
		"network.interfacesMore[0].mtu":                         Reboot,
		"services[0].image":                                     Live,
		"machine.resources.agent.memoryMax":                     Live,
		"machine.api.cert":                                      Live,
		"machine.api.port":                                      Reboot,
		"machine.time.servers[1]":                               Live,
		`cluster.nodeLabels["node.kubernetes.io/exclude"].more`: Live,
	} {
		if got := (Change{Path: path}).Effect(); got != want {
			t.Errorf("Change{Path: %s}.Effect() = %s, want %s", path, got, want)
		}
	}
}

// TestNeedsReboot diffs two real configs and keeps the reboot changes.
func TestNeedsReboot(t *testing.T) {
	old := parseDoc(t, header+machineSection)
	new := parseDoc(t, header+machineSection+"  sysctls: {vm.swappiness: \"10\"}\n")
	new.Machine.Hostname = "other"
	changes := Diff(old, new)
	if len(changes) != 2 {
		t.Fatalf("Diff() = %v, want 2 changes", changes)
	}
	var paths []string
	for _, c := range NeedsReboot(changes) {
		paths = append(paths, c.Path)
	}
	if diff := cmp.Diff([]string{"machine.hostname"}, paths); diff != "" {
		t.Errorf("NeedsReboot() paths (-want +got):\n%s", diff)
	}
}

// TestEffectsDoc checks that docs/machine-config.md holds the effects
// table as EffectsMarkdown writes it; -update rewrites it there.
func TestEffectsDoc(t *testing.T) {
	const doc, begin, end = "../docs/machine-config.md", "<!-- effects:begin -->\n", "<!-- effects:end -->"
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	head, rest, ok := strings.Cut(string(data), begin)
	got, tail, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("%s lacks the markers %q and %q around the effects table", doc, begin, end)
	}
	want := EffectsMarkdown()
	if *update {
		if err := os.WriteFile(doc, []byte(head+begin+want+end+tail), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s's effects table is not EffectsMarkdown()'s (go test ./machineconfig -run TestEffectsDoc -update rewrites it); -want +got:\n%s", doc, diff)
	}
}
