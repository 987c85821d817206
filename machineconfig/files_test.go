package machineconfig

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseSysctlsFiles reads machine.sysctls and machine.files with their
// defaults, and writes them back as they were read.
func TestParseSysctlsFiles(t *testing.T) {
	c, err := Parse([]byte(doc(t, header+machineSection+`  sysctls:
    net.ipv4.tcp_keepalive_time: "600"
    net/ipv4/conf/eth0.100/rp_filter: "2"
    net.ipv4.ip_local_port_range: "32768 60999"
  files:
    - {path: /etc/sysctl.d/90-x.conf, content: "a=1\n", mode: 0600}
    - {path: /var/lib/app/config.json, content: "{}", mode: "0640", owner: "1000:1001"}
    - {path: /etc/motd}
`)))
	if err != nil {
		t.Fatalf("Parse() = %v", err)
	}
	wantSysctls := map[string]string{
		"net.ipv4.tcp_keepalive_time":      "600",
		"net/ipv4/conf/eth0.100/rp_filter": "2",
		"net.ipv4.ip_local_port_range":     "32768 60999",
	}
	wantFiles := []File{
		{Path: "/etc/sysctl.d/90-x.conf", Content: "a=1\n", Mode: 0o600, Owner: "0:0"},
		{Path: "/var/lib/app/config.json", Content: "{}", Mode: 0o640, Owner: "1000:1001"},
		{Path: "/etc/motd", Mode: 0o644, Owner: "0:0"},
	}
	if diff := cmp.Diff(wantSysctls, c.Machine.Sysctls); diff != "" {
		t.Errorf("sysctls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantFiles, c.Machine.Files); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	if uid, gid := c.Machine.Files[1].Ownership(); uid != 1000 || gid != 1001 {
		t.Errorf("Ownership() = %d, %d, want 1000, 1001", uid, gid)
	}
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse(Marshal()) = %v\n%s", err, data)
	}
	if diff := cmp.Diff(c, again); diff != "" {
		t.Errorf("Parse(Marshal()) differs (-first +again):\n%s", diff)
	}
	if got := SysctlPath("net.ipv4.ip_forward"); got != "net/ipv4/ip_forward" {
		t.Errorf("SysctlPath(net.ipv4.ip_forward) = %q, want net/ipv4/ip_forward", got)
	}
}

func TestParseSysctlsFilesInvalid(t *testing.T) {
	_, err := Parse([]byte(doc(t, header+machineSection+`  sysctls:
    vm: "1"
    net.ipv4..x: "1"
    net.ipv4.ip_forward: "0"
    net/ipv4/ip_forward: "0"
    kernel.hostname: other
    vm.swappiness: ""
    vm/swappiness: "10"
    vm.dirty_ratio: "1\n2"
    net/ipv4/../x: "1"
  files:
    - {path: /usr/bin/x}
    - {path: etc/x}
    - {path: /etc/../usr/x}
    - {path: /etc}
    - {path: /etc/hosts}
    - {path: /etc/containerd/config.toml}
    - {path: /var/lib/containerd/x}
    - {path: /etc/a, mode: 04755, owner: root}
    - {path: /etc/a, owner: "0:4294967295"}
    - {content: x}
`)))
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Parse() = %v, want a *ValidationError", err)
	}
	const notName = "is not a sysctl name: use parts of letters, digits, '_' and '-' separated by '.' (or by '/' when a part holds a '.')"
	want := []FieldError{
		{`machine.sysctls["kernel.hostname"]`, `"kernel.hostname" is set by init, from machine.hostname: leave it out`},
		{`machine.sysctls["net.ipv4..x"]`, `"net.ipv4..x" ` + notName},
		{`machine.sysctls["net.ipv4.ip_forward"]`, `"net.ipv4.ip_forward" is set by the pod network: leave it out`},
		{`machine.sysctls["net/ipv4/../x"]`, `"net/ipv4/../x" ` + notName},
		{`machine.sysctls["net/ipv4/ip_forward"]`, `"net/ipv4/ip_forward" is set by the pod network: leave it out`},
		{`machine.sysctls["vm"]`, `"vm" is not a sysctl name: use at least two parts, e.g. vm.swappiness`},
		{`machine.sysctls["vm.dirty_ratio"]`, `value "1\n2": give one line, not empty`},
		{`machine.sysctls["vm.swappiness"]`, `value "": give one line, not empty`},
		{`machine.sysctls["vm/swappiness"]`, `"vm/swappiness" is "vm.swappiness" already, written another way`},
		{"machine.files[0].path", `"/usr/bin/x" is not under /etc or /var: the rest of the node is read-only`},
		{"machine.files[1].path", `"etc/x" is not an absolute, clean path (no '..', '.', '//' or trailing '/')`},
		{"machine.files[2].path", `"/etc/../usr/x" is not an absolute, clean path (no '..', '.', '//' or trailing '/')`},
		{"machine.files[3].path", `"/etc" is not under /etc or /var: the rest of the node is read-only`},
		{"machine.files[4].path", `"/etc/hosts" is written by init, from machine.hostname: choose another path`},
		{"machine.files[5].path", `"/etc/containerd/config.toml" is written by init, from containerd: choose another path`},
		{"machine.files[6].path", `"/var/lib/containerd/x" is written by containerd: choose another path`},
		{"machine.files[7].mode", "4755 has bits beyond 0777: setuid, setgid and sticky are not supported"},
		{"machine.files[7].owner", `"root" is not UID:GID, two numbers such as 0:0`},
		{"machine.files[8].path", `"/etc/a" is machine.files[7]'s already`},
		{"machine.files[8].owner", `"0:4294967295" is not UID:GID, two numbers such as 0:0`},
		{"machine.files[9].path", "required"},
	}
	if diff := cmp.Diff(want, verr.Errors); diff != "" {
		t.Errorf("Parse() errors mismatch (-want +got):\n%s", diff)
	}
}
