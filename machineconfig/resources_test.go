package machineconfig

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// TestResourcesValid parses limits for containerd, the agent and a
// service, written as strings and as bare numbers, and reads them back as
// the numbers the cgroup files take.
func TestResourcesValid(t *testing.T) {
	doc := doc(t, header+`machine:
  hostname: node-1
  api:
    ca: $CA
    cert: $CERT
    key: $KEY
  resources:
    containerd: {memoryMax: 1Gi, cpuWeight: 200, pidsMax: 8192}
    agent: {memoryMax: 536870912, cpuMax: 2}
services:
  - name: exporter
    image: 10.0.2.2:5000/tools/exporter:v1
    resources:
      memoryMax: 1.5G
      cpuMax: 250m
      cpuWeight: 50
      pidsMax: 64
`)
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse() = %v, want no error", err)
	}
	want := MachineResources{
		Containerd: Resources{MemoryMax: "1Gi", CPUWeight: 200, PidsMax: 8192},
		Agent:      Resources{MemoryMax: "536870912", CPUMax: "2"},
	}
	if diff := cmp.Diff(want, c.Machine.Resources); diff != "" {
		t.Errorf("machine.resources mismatch (-want +got):\n%s", diff)
	}
	for _, tt := range []struct {
		name         string
		r            Resources
		bytes, quota int64
	}{
		{"containerd", c.Machine.Resources.Containerd, 1 << 30, 0},
		{"agent", c.Machine.Resources.Agent, 512 << 20, 200_000},
		{"exporter", c.Services[0].Resources, 1_500_000_000, 25_000},
	} {
		if got := tt.r.MemoryBytes(); got != tt.bytes {
			t.Errorf("%s: MemoryBytes() = %d, want %d", tt.name, got, tt.bytes)
		}
		if got := tt.r.CPUQuota(); got != tt.quota {
			t.Errorf("%s: CPUQuota() = %d, want %d (of %d)", tt.name, got, tt.quota, CPUPeriod)
		}
	}
	if r := c.Services[0].Resources; r.CPUWeight != 50 || r.PidsMax != 64 {
		t.Errorf("services[0].resources = %+v, want cpuWeight 50 and pidsMax 64", r)
	}
	// The limits survive Marshal and Parse.
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse(Marshal()) = %v, document:\n%s", err, data)
	}
	if diff := cmp.Diff(c, again); diff != "" {
		t.Errorf("Parse(Marshal()) mismatch (-want +got):\n%s", diff)
	}
}

// TestResourcesInvalid lists each bad limit with its field path.
func TestResourcesInvalid(t *testing.T) {
	doc := doc(t, header+`machine:
  hostname: node-1
  api:
    ca: $CA
    cert: $CERT
    key: $KEY
  resources:
    containerd: {memoryMax: 512, cpuMax: 5m}
    agent: {memoryMax: lots, cpuMax: 1.2345, cpuWeight: 10001, pidsMax: -1}
services:
  - name: exporter
    image: 10.0.2.2:5000/tools/exporter:v1
    resources: {memoryMax: 1Mb, cpuMax: half, cpuWeight: -5}
`)
	_, err := Parse([]byte(doc))
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Parse() = %v, want a *ValidationError", err)
	}
	want := []FieldError{
		{"machine.resources.containerd.memoryMax", "512 bytes is less than 1Mi: add a suffix, e.g. 512Mi"},
		{"machine.resources.containerd.cpuMax", `"5m" is less than 10m, the least the kernel allows (1 ms in every 100 ms)`},
		{"machine.resources.agent.memoryMax", `"lots" is not a memory size: use bytes or a quantity such as 256Mi or 1G`},
		{"machine.resources.agent.cpuMax", `"1.2345" is not a CPU amount: use CPUs such as 0.5 or 2, or thousandths such as 500m`},
		{"machine.resources.agent.cpuWeight", "10001 is out of range 1..10000"},
		{"machine.resources.agent.pidsMax", "-1 is negative: use at least 1, or leave it out for no limit"},
		{"services[0].resources.memoryMax", `"1Mb" is not a memory size: use bytes or a quantity such as 256Mi or 1G`},
		{"services[0].resources.cpuMax", `"half" is not a CPU amount: use CPUs such as 0.5 or 2, or thousandths such as 500m`},
		{"services[0].resources.cpuWeight", "-5 is out of range 1..10000"},
	}
	if diff := cmp.Diff(want, verr.Errors); diff != "" {
		t.Errorf("Parse() errors mismatch (-want +got):\n%s", diff)
	}
}

func TestQuantity(t *testing.T) {
	for _, tt := range []struct {
		q       Quantity
		bytes   int64
		millis  int64
		bytesOK bool
		cpuOK   bool
	}{
		{"256Mi", 256 << 20, 0, true, false},
		{"1G", 1e9, 0, true, false},
		{"1.5Gi", 3 << 29, 0, true, false},
		{"4096", 4096, 4_096_000, true, true},
		{"500m", 0, 500, false, true},
		{"0.25", 0, 250, true, true},
		{"2.5", 2, 2500, true, true},
		{"1e9", 0, 0, false, false},
		{"-1", 0, 0, false, false},
		{"", 0, 0, false, false},
	} {
		b, err := tt.q.Bytes()
		if (err == nil) != tt.bytesOK || (err == nil && b != tt.bytes) {
			t.Errorf("Quantity(%q).Bytes() = %d, %v; want %d (ok %t)", tt.q, b, err, tt.bytes, tt.bytesOK)
		}
		m, err := tt.q.MilliCPUs()
		if (err == nil) != tt.cpuOK || (err == nil && m != tt.millis) {
			t.Errorf("Quantity(%q).MilliCPUs() = %d, %v; want %d (ok %t)", tt.q, m, err, tt.millis, tt.cpuOK)
		}
	}
}

func TestQuantityDecode(t *testing.T) {
	for _, tt := range []struct {
		doc  string
		want Quantity
	}{
		{`memoryMax: 1073741824`, "1073741824"},
		{`memoryMax: "1Gi"`, "1Gi"},
		{`memoryMax: 0.5`, "0.5"},
	} {
		var r Resources
		if err := yaml.UnmarshalStrict([]byte(tt.doc), &r); err != nil || r.MemoryMax != tt.want {
			t.Errorf("decode %q = %q, %v; want %q", tt.doc, r.MemoryMax, err, tt.want)
		}
	}
	var r Resources
	if err := yaml.UnmarshalStrict([]byte(`memoryMax: [1]`), &r); err == nil {
		t.Errorf("decode a list as memoryMax = %q, want an error", r.MemoryMax)
	}
}
