package machineconfig

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fixture holds PEMs shared by the tests: a CA with a server certificate
// and key, and a second CA with its own server certificate and key.
type fixture struct {
	ca, cert, key                string
	otherCA, otherCert, otherKey string
}

var loadFixture = sync.OnceValues(func() (fixture, error) {
	now := time.Now()
	var f fixture
	for _, out := range []struct{ ca, cert, key *string }{
		{&f.ca, &f.cert, &f.key},
		{&f.otherCA, &f.otherCert, &f.otherKey},
	} {
		ca, err := NewCA("test ca", now)
		if err != nil {
			return f, err
		}
		cert, key, err := ca.IssueServer("node-1", []string{"node-1"}, nil, now)
		if err != nil {
			return f, err
		}
		*out.ca, *out.cert, *out.key = string(ca.CertPEM), string(cert), string(key)
	}
	return f, nil
})

func testFixture(t *testing.T) fixture {
	t.Helper()
	f, err := loadFixture()
	if err != nil {
		t.Fatalf("create test PKI: %v", err)
	}
	return f
}

// doc replaces the placeholders $CA, $CERT, $KEY, $OTHERCA, $OTHERCERT and
// $OTHERKEY in s with the fixture's PEMs as quoted YAML strings.
func doc(t *testing.T, s string) string {
	t.Helper()
	f := testFixture(t)
	return strings.NewReplacer(
		"$OTHERCA", strconv.Quote(f.otherCA),
		"$OTHERCERT", strconv.Quote(f.otherCert),
		"$OTHERKEY", strconv.Quote(f.otherKey),
		"$CA", strconv.Quote(f.ca),
		"$CERT", strconv.Quote(f.cert),
		"$KEY", strconv.Quote(f.key),
	).Replace(s)
}

const header = `apiVersion: cairn.dev/v1alpha1
kind: MachineConfig
`

// machineSection is a valid machine section.
const machineSection = `machine:
  hostname: node-1
  api:
    ca: $CA
    cert: $CERT
    key: $KEY
`

func TestParseValid(t *testing.T) {
	f := testFixture(t)
	api := API{Port: DefaultAPIPort, MetricsPort: DefaultMetricsPort, CA: f.ca, Cert: f.cert, Key: f.key}
	tests := []struct {
		name string
		doc  string
		want Config
	}{
		{
			name: "minimal DHCP",
			doc:  header + machineSection,
			want: Config{
				APIVersion: APIVersion,
				Kind:       KindMachineConfig,
				Machine:    Machine{Hostname: "node-1", API: api},
				Network:    Network{Interfaces: []Interface{{DHCP: true}}},
			},
		},
		{
			name: "static with routes",
			doc: header + `machine:
  hostname: node-1.example.com
  api:
    port: 6443
    ca: $CA
    cert: $CERT
    key: $KEY
network:
  interfaces:
    - name: eth0
      addresses: ["10.0.2.15/24", "fd00::15/64"]
      routes:
        - to: 0.0.0.0/0
          via: 10.0.2.2
        - to: ::/0
          via: fd00::1
          metric: 100
        - to: 192.168.0.0/16
          via: 10.0.2.3
      mtu: 9000
    - name: eth1
      dhcp: true
  nameservers: ["10.0.2.3", "fd00::3"]
`,
			want: Config{
				APIVersion: APIVersion,
				Kind:       KindMachineConfig,
				Machine: Machine{
					Hostname: "node-1.example.com",
					API:      API{Port: 6443, MetricsPort: DefaultMetricsPort, CA: f.ca, Cert: f.cert, Key: f.key},
				},
				Network: Network{
					Interfaces: []Interface{
						{
							Name:      "eth0",
							Addresses: []string{"10.0.2.15/24", "fd00::15/64"},
							Routes: []Route{
								{To: "0.0.0.0/0", Via: "10.0.2.2"},
								{To: "::/0", Via: "fd00::1", Metric: 100},
								{To: "192.168.0.0/16", Via: "10.0.2.3"},
							},
							MTU: 9000,
						},
						{Name: "eth1", DHCP: true},
					},
					Nameservers: []string{"10.0.2.3", "fd00::3"},
				},
			},
		},
		{
			name: "by MAC",
			doc: header + machineSection + `network:
  interfaces:
    - mac: "52:54:00:12:34:56"
      dhcp: true
    - mac: 52:54:00:AB:CD:EF
      addresses: [10.0.3.15/24]
`,
			want: Config{
				APIVersion: APIVersion,
				Kind:       KindMachineConfig,
				Machine:    Machine{Hostname: "node-1", API: api},
				Network: Network{Interfaces: []Interface{
					{MAC: "52:54:00:12:34:56", DHCP: true},
					{MAC: "52:54:00:AB:CD:EF", Addresses: []string{"10.0.3.15/24"}},
				}},
			},
		},
		{
			name: "static on the first link",
			doc: header + machineSection + `network:
  interfaces:
    - addresses: [10.0.2.15/24]
`,
			want: Config{
				APIVersion: APIVersion,
				Kind:       KindMachineConfig,
				Machine:    Machine{Hostname: "node-1", API: api},
				Network:    Network{Interfaces: []Interface{{Addresses: []string{"10.0.2.15/24"}}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(doc(t, tt.doc)))
			if err != nil {
				t.Fatalf("Parse() = %v, want no error", err)
			}
			if diff := cmp.Diff(&tt.want, got); diff != "" {
				t.Errorf("Parse() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []FieldError
	}{
		{
			name: "bad CIDR in second address",
			doc: header + machineSection + `network:
  interfaces:
    - name: eth0
      addresses: ["10.0.0.3/24", "10.0.0.300/24"]
`,
			want: []FieldError{{"network.interfaces[0].addresses[1]", `"10.0.0.300/24" is not a CIDR`}},
		},
		{
			name: "bad services and registries",
			doc: header + machineSection + `containerd:
  registries:
    - host: 10.0.2.2:5000
      endpoints: ["http://10.0.2.2:5000"]
    - host: 10.0.2.2:5000
    - host: "https://x"
      endpoints: ["ftp://mirror"]
services:
  - name: exporter
    image: 10.0.2.2:5000/tools/exporter:v1
    env: ["A=1", "novalue"]
    mounts: [{source: /var/lib/x, destination: data}]
  - name: exporter
    image: "UPPER/Case"
  - name: containerd
    image: busybox
    restart: sometimes
  - name: Bad_Name
`,
			want: []FieldError{
				{"containerd.registries[1].host", `"10.0.2.2:5000" is already configured by containerd.registries[0]`},
				{"containerd.registries[2].host", `"https://x" is not a registry host[:port]`},
				{"containerd.registries[2].endpoints[0]", `"ftp://mirror" is not an http:// or https:// URL`},
				{"services[0].env[1]", `"novalue" is not KEY=value`},
				{"services[0].mounts[0].destination", `"data" is not an absolute path`},
				{"services[1].name", `"exporter" is already used by services[0]`},
				{"services[1].image", `"UPPER/Case" is not an image reference: invalid reference format: repository name (Case) must be lowercase`},
				{"services[2].name", `"containerd" is a built-in service`},
				{"services[2].restart", `"sometimes" is not one of always, on-failure, never`},
				{"services[3].name", `"Bad_Name" is not a lowercase DNS label`},
				{"services[3].image", "required"},
			},
		},
		{
			name: "wrong kind",
			doc:  "apiVersion: cairn.dev/v1alpha1\nkind: ClientConfig\n" + machineSection,
			want: []FieldError{{"kind", `"ClientConfig" is not supported; use MachineConfig`}},
		},
		{
			name: "wrong apiVersion",
			doc:  "apiVersion: cairn.dev/v1\nkind: MachineConfig\n" + machineSection,
			want: []FieldError{{"apiVersion", `"cairn.dev/v1" is not supported; use cairn.dev/v1alpha1`}},
		},
		{
			name: "missing apiVersion and kind",
			doc:  machineSection,
			want: []FieldError{
				{"apiVersion", "required; use cairn.dev/v1alpha1"},
				{"kind", "required; use MachineConfig"},
			},
		},
		{
			name: "missing hostname",
			doc: header + `machine:
  api:
    ca: $CA
    cert: $CERT
    key: $KEY
`,
			want: []FieldError{{"machine.hostname", "required"}},
		},
		{
			name: "bad hostname",
			doc:  header + strings.Replace(machineSection, "node-1", "Node_1", 1),
			want: []FieldError{{"machine.hostname", `"Node_1" is not a valid hostname: use at most 64 lowercase letters, digits, '-' and '.', each label starting and ending with a letter or digit`}},
		},
		{
			name: "both name and mac",
			doc: header + machineSection + `network:
  interfaces:
    - name: eth0
      dhcp: true
    - name: eth1
      mac: "52:54:00:12:34:56"
      dhcp: true
`,
			want: []FieldError{{"network.interfaces[1]", "set exactly one of name or mac"}},
		},
		{
			name: "empty selector among several interfaces",
			doc: header + machineSection + `network:
  interfaces:
    - dhcp: true
    - name: eth1
      dhcp: true
`,
			want: []FieldError{{"network.interfaces[0]", "set exactly one of name or mac"}},
		},
		{
			name: "bad MAC",
			doc: header + machineSection + `network:
  interfaces:
    - mac: "52:54:00:12:34"
      dhcp: true
`,
			want: []FieldError{{"network.interfaces[0].mac", `"52:54:00:12:34" is not a MAC address`}},
		},
		{
			name: "bad interface name",
			doc: header + machineSection + `network:
  interfaces:
    - name: a-very-long-interface-name
      dhcp: true
`,
			want: []FieldError{{"network.interfaces[0].name", `"a-very-long-interface-name" is not a valid interface name: use at most 15 characters, without '/', ':' or spaces`}},
		},
		{
			name: "duplicate selectors",
			doc: header + machineSection + `network:
  interfaces:
    - name: eth0
      dhcp: true
    - mac: "52:54:00:12:34:56"
      dhcp: true
    - name: eth0
      dhcp: true
    - mac: "52-54-00-12-34-56"
      dhcp: true
`,
			want: []FieldError{
				{"network.interfaces[2].name", `"eth0" is already selected by network.interfaces[0].name`},
				{"network.interfaces[3].mac", `"52-54-00-12-34-56" is already selected by network.interfaces[1].mac`},
			},
		},
		{
			name: "neither dhcp nor address",
			doc: header + machineSection + `network:
  interfaces:
    - name: eth0
      mtu: 1500
`,
			want: []FieldError{{"network.interfaces[0]", "needs dhcp: true or at least one address"}},
		},
		{
			name: "bad routes",
			doc: header + machineSection + `network:
  interfaces:
    - name: eth0
      addresses: [10.0.2.15/24]
      routes:
        - to: 0.0.0.0/0
          via: x
        - to: default
          via: 10.0.2.2
        - to: 10.1.0.1/16
        - to: ::/0
          via: 10.0.2.2
`,
			want: []FieldError{
				{"network.interfaces[0].routes[0].via", `"x" is not an IP address`},
				{"network.interfaces[0].routes[1].to", `"default" is not a CIDR; use 0.0.0.0/0 or ::/0`},
				{"network.interfaces[0].routes[2].to", `"10.1.0.1/16" has host bits set; use "10.1.0.0/16"`},
				{"network.interfaces[0].routes[2].via", "required"},
				{"network.interfaces[0].routes[3].via", `"10.0.2.2" is not in the address family of "::/0"`},
			},
		},
		{
			name: "bad nameserver",
			doc: header + machineSection + `network:
  nameservers: ["10.0.2.3", "dns.example.com"]
`,
			want: []FieldError{{"network.nameservers[1]", `"dns.example.com" is not an IP address`}},
		},
		{
			name: "mtu out of range",
			doc: header + machineSection + `network:
  interfaces:
    - name: eth0
      dhcp: true
      mtu: 67
    - name: eth1
      dhcp: true
      mtu: 65536
`,
			want: []FieldError{
				{"network.interfaces[0].mtu", "67 is out of range 68..65535 (or 0 to leave it as is)"},
				{"network.interfaces[1].mtu", "65536 is out of range 68..65535 (or 0 to leave it as is)"},
			},
		},
		{
			name: "port out of range",
			doc:  header + strings.Replace(machineSection, "  api:\n", "  api:\n    port: 65536\n", 1),
			want: []FieldError{{"machine.api.port", "65536 is out of range 1..65535"}},
		},
		{
			name: "metrics port taken by the API",
			doc:  header + strings.Replace(machineSection, "  api:\n", "  api:\n    metricsPort: 50000\n", 1),
			want: []FieldError{{"machine.api.metricsPort", "50000 is machine.api.port already"}},
		},
		{
			name: "bad cert PEM",
			doc:  header + strings.Replace(machineSection, "$CERT", "not a certificate", 1),
			want: []FieldError{{"machine.api.cert", "not a PEM certificate"}},
		},
		{
			name: "bad key PEM",
			doc:  header + strings.Replace(machineSection, "$KEY", "$CERT", 1),
			want: []FieldError{{"machine.api.key", "not a PEM private key"}},
		},
		{
			name: "CA is not a CA",
			doc:  header + strings.Replace(machineSection, "ca: $CA", "ca: $CERT", 1),
			want: []FieldError{{"machine.api.ca", "not a CA certificate"}},
		},
		{
			name: "cert from another CA",
			doc: header + strings.NewReplacer("$CERT", "$OTHERCERT", "$KEY", "$OTHERKEY").
				Replace(machineSection),
			want: []FieldError{{"machine.api.cert", "not signed by machine.api.ca"}},
		},
		{
			name: "key not matching",
			doc:  header + strings.Replace(machineSection, "$KEY", "$OTHERKEY", 1),
			want: []FieldError{{"machine.api.key", "does not match machine.api.cert"}},
		},
		{
			name: "everything at once",
			doc: `apiVersion: v1
machine:
  api:
    port: -1
network:
  interfaces:
    - name: eth0
      mac: "52:54:00:12:34:56"
      addresses: [10.0.2.15]
  nameservers: [x]
`,
			want: []FieldError{
				{"apiVersion", `"v1" is not supported; use cairn.dev/v1alpha1`},
				{"kind", "required; use MachineConfig"},
				{"machine.hostname", "required"},
				{"machine.api.port", "-1 is out of range 1..65535"},
				{"machine.api.ca", "required"},
				{"machine.api.cert", "required"},
				{"machine.api.key", "required"},
				{"network.interfaces[0]", "set exactly one of name or mac"},
				{"network.interfaces[0].addresses[0]", `"10.0.2.15" is not a CIDR`},
				{"network.nameservers[0]", `"x" is not an IP address`},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(doc(t, tt.doc)))
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Parse() = %v, want a *ValidationError", err)
			}
			if got == nil {
				t.Errorf("Parse() returned no config with its validation error")
			}
			if diff := cmp.Diff(tt.want, verr.Errors); diff != "" {
				t.Errorf("Parse() errors mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseDecodeError(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{
			name: "unknown field",
			doc:  header + machineSection + "network:\n  interfaces:\n    - name: eth0\n      dhcp: true\n      mtuu: 1500\n",
			want: `unknown field "mtuu"`,
		},
		{
			name: "wrong type",
			doc:  header + machineSection + "network:\n  interfaces:\n    - name: eth0\n      mtu: big\n",
			want: "cannot unmarshal string",
		},
		{
			name: "duplicate key",
			doc:  header + "kind: MachineConfig\n" + machineSection,
			want: `key "kind" already set`,
		},
		{
			name: "not YAML",
			doc:  "machine: [",
			want: "yaml: line 1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(doc(t, tt.doc)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse() = %v, want an error containing %q", err, tt.want)
			}
			if got != nil {
				t.Errorf("Parse() = %+v, want no config", got)
			}
		})
	}
}

func TestValidationErrorString(t *testing.T) {
	err := &ValidationError{Doc: "machine config", Errors: []FieldError{
		{"machine.hostname", "required"},
		{"network.interfaces[1]", "set exactly one of name or mac"},
	}}
	want := "invalid machine config:\n  machine.hostname: required\n  network.interfaces[1]: set exactly one of name or mac"
	if got := err.Error(); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestSetDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   Config
		want Config
	}{
		{
			name: "empty",
			want: Config{
				Machine: Machine{API: API{Port: DefaultAPIPort, MetricsPort: DefaultMetricsPort}},
				Network: Network{Interfaces: []Interface{{DHCP: true}}},
			},
		},
		{
			name: "set values are kept",
			in: Config{
				Machine: Machine{API: API{Port: 1234, MetricsPort: 1235}},
				Network: Network{Interfaces: []Interface{{Name: "eth1", Addresses: []string{"10.0.0.2/8"}}}},
			},
			want: Config{
				Machine: Machine{API: API{Port: 1234, MetricsPort: 1235}},
				Network: Network{Interfaces: []Interface{{Name: "eth1", Addresses: []string{"10.0.0.2/8"}}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in
			got.SetDefaults()
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("SetDefaults() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	f := testFixture(t)
	want := &Config{
		APIVersion: APIVersion,
		Kind:       KindMachineConfig,
		Machine: Machine{
			Hostname: "node-1",
			API:      API{Port: 50001, MetricsPort: 50002, CA: f.ca, Cert: f.cert, Key: f.key},
		},
		Network: Network{
			Interfaces: []Interface{
				{
					Name:      "eth0",
					Addresses: []string{"10.0.2.15/24"},
					Routes:    []Route{{To: "0.0.0.0/0", Via: "10.0.2.2", Metric: 10}},
					MTU:       1500,
				},
				{MAC: "52:54:00:12:34:56", DHCP: true},
			},
			Nameservers: []string{"10.0.2.3"},
		},
	}
	data, err := want.Marshal()
	if err != nil {
		t.Fatalf("Marshal() = %v", err)
	}
	got, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse(Marshal()) = %v, document:\n%s", err, data)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parse(Marshal()) mismatch (-want +got):\n%s", diff)
	}
	again, err := got.Marshal()
	if err != nil {
		t.Fatalf("Marshal() = %v", err)
	}
	if diff := cmp.Diff(string(data), string(again)); diff != "" {
		t.Errorf("Marshal() is not stable (-first +second):\n%s", diff)
	}
}

func TestLoad(t *testing.T) {
	if _, err := Load(t.TempDir() + "/missing.yaml"); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load(missing) = %v, want an error naming the file", err)
	}
}
