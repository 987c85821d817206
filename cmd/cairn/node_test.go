package main

import (
	"testing"

	"github.com/cairn-os/cairn/api/machine"
)

func TestLimits(t *testing.T) {
	for _, tt := range []struct {
		l    *machine.CgroupLimits
		want string
	}{
		{nil, "-"},
		{&machine.CgroupLimits{MemoryMax: "max", CpuMax: "max 100000", CpuWeight: "100", PidsMax: "max"}, "-"},
		{&machine.CgroupLimits{MemoryMax: "67108864", CpuMax: "25000 100000", CpuWeight: "50", PidsMax: "64"}, "mem 64Mi, cpu 0.25, weight 50, pids 64"},
		{&machine.CgroupLimits{MemoryMax: "1000000", CpuMax: "150000 100000"}, "mem 1000000, cpu 1.5"},
	} {
		if got := limits(tt.l); got != tt.want {
			t.Errorf("limits(%v) = %q, want %q", tt.l, got, tt.want)
		}
	}
}
