package machineconfig

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestApplyPatch(t *testing.T) {
	base := []byte(doc(t, header+machineSection+`network:
  nameservers: ["10.0.2.3"]
`))
	tests := []struct {
		name    string
		patches []string
		check   func(*Config) string // what is wrong with the result, or ""
	}{
		{
			name:    "merge patch in YAML",
			patches: []string{"machine:\n  hostname: node-2\n  sysctls: {vm.swappiness: \"10\"}\nnetwork: {nameservers: null}\n"},
			check: func(c *Config) string {
				if c.Machine.Hostname != "node-2" || c.Machine.Sysctls["vm.swappiness"] != "10" || c.Network.Nameservers != nil || c.Machine.API.Cert == "" {
					return "want hostname node-2, the sysctl, no nameservers and the API kept"
				}
				return ""
			},
		},
		{
			name: "JSON patch in YAML, then a merge patch in JSON",
			patches: []string{
				"- {op: add, path: /network/nameservers/-, value: 10.0.2.9}\n- {op: test, path: /machine/hostname, value: node-1}\n- {op: replace, path: /machine/hostname, value: node-3}\n",
				`{"machine": {"files": [{"path": "/etc/motd", "content": "hi"}]}}`,
			},
			check: func(c *Config) string {
				want := []string{"10.0.2.3", "10.0.2.9"}
				if c.Machine.Hostname != "node-3" || !cmp.Equal(c.Network.Nameservers, want) || len(c.Machine.Files) != 1 {
					return "want hostname node-3, nameservers " + strings.Join(want, ", ") + " and one file"
				}
				return ""
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := base
			for _, p := range tt.patches {
				var err error
				if out, err = ApplyPatch(out, []byte(p)); err != nil {
					t.Fatalf("ApplyPatch(%q) = %v", p, err)
				}
			}
			c, err := Parse(out)
			if err != nil {
				t.Fatalf("Parse(patched) = %v\n%s", err, out)
			}
			if msg := tt.check(c); msg != "" {
				t.Errorf("patched config %+v: %s", c.Machine, msg)
			}
		})
	}

	for _, tt := range []struct{ name, patch, want string }{
		{"path that is not there", "[{op: replace, path: /machine/nope/x, value: 1}]", "JSON patch operation 0 (replace /machine/nope/x): "},
		{"failed test", "[{op: add, path: /machine/sysctls, value: {}}, {op: test, path: /machine/hostname, value: other}]", "JSON patch operation 1 (test /machine/hostname): "},
		{"unknown operation", "[{op: frobnicate, path: /machine}]", `JSON patch: invalid operation {"op":"frobnicate","path":"/machine"}: unsupported operation`},
		{"neither a list nor an object", `"hello"`, "not a patch: want a list of RFC 6902 operations"},
		{"not YAML", "machine: [", "decode the patch: "},
	} {
		_, err := ApplyPatch(base, []byte(tt.patch))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ApplyPatch(%s: %s) = %v, want an error containing %q", tt.name, tt.patch, err, tt.want)
		}
	}
	if _, err := ApplyPatch([]byte("- a\n"), []byte("{}")); err == nil || !strings.Contains(err.Error(), "not a YAML or JSON object") {
		t.Errorf("ApplyPatch(a list as the config) = %v, want it refused", err)
	}
}
