package machineconfig

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func parseDoc(t *testing.T, s string) *Config {
	t.Helper()
	c, err := Parse([]byte(doc(t, s)))
	if err != nil {
		t.Fatalf("Parse() = %v\n%s", err, s)
	}
	return c
}

func TestDiff(t *testing.T) {
	old := parseDoc(t, header+machineSection+`  sysctls: {vm.swappiness: "10", net.core.somaxconn: "1024"}
  files:
    - {path: /etc/a, content: one}
    - {path: /etc/b, content: two}
  staticPods:
    - {apiVersion: v1, kind: Pod, metadata: {name: web}, spec: {containers: [{name: web, image: "web:1"}]}}
network:
  interfaces:
    - name: eth0
      addresses: ["10.0.2.15/24", "10.0.3.15/24"]
  nameservers: ["10.0.2.3"]
`)
	newer := parseDoc(t, header+`machine:
  hostname: node-2
  api:
    ca: $OTHERCA
    cert: $OTHERCERT
    key: $OTHERKEY
  sysctls: {vm.swappiness: "20", kernel.panic: "10"}
  files:
    - {path: /etc/a, content: one, mode: 0600}
    - {path: /etc/c, content: three}
    - {path: /etc/b, content: two}
  staticPods:
    - {apiVersion: v1, kind: Pod, metadata: {name: web}, spec: {containers: [{name: web, image: "web:2"}]}}
network:
  interfaces:
    - name: eth0
      addresses: ["10.0.3.15/24", "10.0.4.15/24"]
      mtu: 9000
  nameservers: ["10.0.2.3", "10.0.2.4"]
`)
	var got []string
	for _, c := range Diff(old, newer) {
		s := c.String()
		// PEMs are their size and digest, not shown here.
		if c.Path == "machine.api.ca" || c.Path == "machine.api.cert" {
			if !strings.Contains(s, "bytes, sha256 ") || strings.Contains(s, "BEGIN") {
				t.Errorf("%s shown as %q, want its size and digest", c.Path, s)
			}
			s = c.Path + ": " + strings.ToUpper(strings.TrimPrefix(c.Path, "machine.api."))
		}
		got = append(got, s)
	}
	want := []string{
		`machine.hostname: "node-1" → "node-2"`,
		`machine.api.ca: CA`,
		`machine.api.cert: CERT`,
		`machine.api.key: (secret) → (secret)`,
		`machine.staticPods[0].spec.containers[0].image: "web:1" → "web:2"`,
		`machine.sysctls["kernel.panic"]: added "10"`,
		`machine.sysctls["net.core.somaxconn"]: removed "1024"`,
		`machine.sysctls["vm.swappiness"]: "10" → "20"`,
		`machine.files[0].mode: "0644" → "0600"`,
		`machine.files[1]: added {"content":"three","mode":"0644","owner":"0:0","path":"/etc/c"}`,
		`network.interfaces[0].addresses[0]: removed "10.0.2.15/24"`,
		`network.interfaces[0].addresses[1]: added "10.0.4.15/24"`,
		`network.interfaces[0].mtu: added 9000`,
		`network.nameservers[1]: added "10.0.2.4"`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Diff() (-want +got):\n%s", diff)
	}
	// Backwards, what was added is removed: of the list items, by their
	// index in the list they leave.
	back := map[string]string{}
	for _, c := range Diff(newer, old) {
		back[c.Path] = c.String()
	}
	for _, want := range []string{
		`network.nameservers[1]: removed "10.0.2.4"`,
		`machine.files[1]: removed {"content":"three","mode":"0644","owner":"0:0","path":"/etc/c"}`,
		`network.interfaces[0].addresses[1]: removed "10.0.4.15/24"`,
		`network.interfaces[0].addresses[0]: added "10.0.2.15/24"`,
		`machine.sysctls["kernel.panic"]: removed "10"`,
	} {
		path, _, _ := strings.Cut(want, ": ")
		if back[path] != want {
			t.Errorf("Diff(new, old)[%s] = %q, want %q", path, back[path], want)
		}
	}

	if d := Diff(old, old); len(d) != 0 {
		t.Errorf("Diff(c, c) = %v, want no change", d)
	}

	// A section added is each of its fields added; a long string is its
	// size and digest, a secret neither.
	withCluster := parseDoc(t, header+machineSection+`cluster:
  server: https://10.0.2.2:6443
  ca: $CA
  bootstrapToken: abcdef.0123456789abcdef
`)
	got = nil
	for _, c := range Diff(old, withCluster) {
		if strings.HasPrefix(c.Path, "cluster") {
			got = append(got, c.String())
		}
	}
	for i, s := range got {
		if strings.HasPrefix(s, "cluster.ca: added ") {
			if !strings.Contains(s, "bytes, sha256 ") || strings.Contains(s, "BEGIN") {
				t.Errorf("cluster.ca shown as %q, want its size and digest", s)
			}
			got[i] = "cluster.ca: added (PEM)"
		}
	}
	want = []string{
		`cluster.server: added "https://10.0.2.2:6443"`,
		`cluster.ca: added (PEM)`,
		`cluster.bootstrapToken: added (secret)`,
		`cluster.podNetwork.mode: added "auto"`,
		`cluster.clusterDomain: added "cluster.local"`,
		`cluster.kubeletPort: added 10250`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Diff(without cluster, with) (-want +got):\n%s", diff)
	}
}
