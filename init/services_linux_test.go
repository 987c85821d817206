package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/opencontainers/cgroups"

	"github.com/cairn-os/cairn/machineconfig"
)

// TestCgroupResources turns the machine config's limits into the
// supervisor's: memory.max in bytes, cpu.max as a quota of 100 ms.
func TestCgroupResources(t *testing.T) {
	pids := int64(64)
	for _, tt := range []struct {
		name string
		r    machineconfig.Resources
		want *cgroups.Resources
	}{
		{"none", machineconfig.Resources{}, nil},
		{
			"all",
			machineconfig.Resources{MemoryMax: "64Mi", CPUMax: "250m", CPUWeight: 50, PidsMax: 64},
			&cgroups.Resources{Memory: 64 << 20, CpuQuota: 25_000, CpuPeriod: 100_000, CpuWeight: 50, PidsLimit: &pids},
		},
		{"memory only", machineconfig.Resources{MemoryMax: "1G"}, &cgroups.Resources{Memory: 1e9}},
		{"two CPUs", machineconfig.Resources{CPUMax: "2"}, &cgroups.Resources{CpuQuota: 200_000, CpuPeriod: 100_000}},
	} {
		if diff := cmp.Diff(tt.want, cgroupResources(tt.r)); diff != "" {
			t.Errorf("%s: cgroupResources(%+v) mismatch (-want +got):\n%s", tt.name, tt.r, diff)
		}
	}
}
