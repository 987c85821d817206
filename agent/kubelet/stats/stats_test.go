package stats

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/procfs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

func TestCPURate(t *testing.T) {
	const s = int64(1e9) // a second in nanoseconds
	type step struct {
		key   string
		at    int64
		usage uint64
		want  int64 // -1: no rate
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a first sample has no rate", []step{{"c", 10 * s, 5e9, -1}}},
		{"half a core over two seconds", []step{{"c", 10 * s, 5e9, -1}, {"c", 12 * s, 6e9, 5e8}}},
		{"two cores", []step{{"c", s, 0, -1}, {"c", 2 * s, 2e9, 2e9}}},
		{"idle", []step{{"c", s, 7, -1}, {"c", 3 * s, 7, 0}}},
		{"the same sample again keeps the last rate",
			[]step{{"c", s, 0, -1}, {"c", 2 * s, 1e9, 1e9}, {"c", 2 * s, 1e9, 1e9}, {"c", 3 * s, 1.5e9, 5e8}}},
		{"a sample soon after the last keeps the last rate, and is not kept",
			[]step{{"c", s, 0, -1}, {"c", 2 * s, 1e9, 1e9}, {"c", 2*s + s/10, 1e9, 1e9}, {"c", 4 * s, 2e9, 5e8}}},
		{"a second sample soon after the first has no rate yet",
			[]step{{"c", s, 0, -1}, {"c", s + s/2, 1e9, -1}, {"c", 2 * s, 1e9, 1e9}}},
		{"an older sample keeps the last rate",
			[]step{{"c", s, 0, -1}, {"c", 3 * s, 1e9, 5e8}, {"c", 2 * s, 9e8, 5e8}}},
		{"usage that went back starts again",
			[]step{{"c", s, 5e9, -1}, {"c", 2 * s, 1e9, -1}, {"c", 3 * s, 2e9, 1e9}}},
		{"keys apart", []step{{"a", s, 0, -1}, {"b", s, 0, -1}, {"a", 2 * s, 1e9, 1e9}, {"b", 3 * s, 1e9, 5e8}}},
		{"large counters", []step{{"c", s, 1e18, -1}, {"c", 2 * s, 1e18 + 3e9, 3e9}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r cpuRates
			for i, st := range tt.steps {
				got := r.rate(st.key, st.at, st.usage)
				switch {
				case st.want < 0 && got != nil:
					t.Errorf("step %d: rate(%q, %d, %d) = %d, want none", i, st.key, st.at, st.usage, *got)
				case st.want >= 0 && (got == nil || *got != uint64(st.want)):
					t.Errorf("step %d: rate(%q, %d, %d) = %v, want %d", i, st.key, st.at, st.usage, got, st.want)
				}
			}
		})
	}
}

func TestCPURateKeep(t *testing.T) {
	var r cpuRates
	r.rate("gone", 1, 0)
	r.rate("kept", 1, 0)
	r.keep(map[string]bool{"kept": true})
	if got := r.rate("gone", 2e9, 1e9); got != nil {
		t.Errorf("rate of a forgotten key = %d, want none: its old sample was kept", *got)
	}
	if got := r.rate("kept", 1e9+1, 1e9); got == nil || *got != 1e9 {
		t.Errorf("rate of a kept key = %v, want 1e9", got)
	}
}

func TestSumContainers(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	t1, t2 := metav1.Unix(100, 0), metav1.Unix(105, 0)
	cpu, mem := sumContainers([]statsv1alpha1.ContainerStats{
		{Name: "a", CPU: &statsv1alpha1.CPUStats{Time: t2, UsageNanoCores: u(3e8), UsageCoreNanoSeconds: u(5e9)},
			Memory: &statsv1alpha1.MemoryStats{Time: t1, WorkingSetBytes: u(10 << 20), UsageBytes: u(12 << 20)}},
		// A first reading has no rate yet: the pod's is the others'.
		{Name: "b", CPU: &statsv1alpha1.CPUStats{Time: t1, UsageCoreNanoSeconds: u(1e9)},
			Memory: &statsv1alpha1.MemoryStats{Time: t2, WorkingSetBytes: u(1 << 20), RSSBytes: u(1 << 20)}},
		{Name: "no stats yet"},
	})
	wantCPU := &statsv1alpha1.CPUStats{Time: t2, UsageNanoCores: u(3e8), UsageCoreNanoSeconds: u(6e9)}
	wantMem := &statsv1alpha1.MemoryStats{Time: t2, WorkingSetBytes: u(11 << 20), UsageBytes: u(12 << 20), RSSBytes: u(1 << 20)}
	if diff := cmp.Diff(wantCPU, cpu); diff != "" {
		t.Errorf("sumContainers() CPU (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantMem, mem); diff != "" {
		t.Errorf("sumContainers() memory (-want +got):\n%s", diff)
	}
	if cpu, mem := sumContainers(nil); cpu != nil || mem != nil {
		t.Errorf("sumContainers(nil) = %v, %v; want none", cpu, mem)
	}
}

func TestNodeMemory(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	now := time.Unix(100, 0)
	got, err := nodeMemory(procfs.Meminfo{MemTotalBytes: u(1000), MemFreeBytes: u(300), InactiveFileBytes: u(200),
		AnonPagesBytes: u(250)}, now)
	if err != nil {
		t.Fatal(err)
	}
	// Used 700, of which 200 the kernel may drop.
	want := &statsv1alpha1.MemoryStats{Time: metav1.NewTime(now), UsageBytes: u(700), WorkingSetBytes: u(500),
		AvailableBytes: u(500), RSSBytes: u(250)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("nodeMemory() (-want +got):\n%s", diff)
	}
	if _, err := nodeMemory(procfs.Meminfo{MemTotalBytes: u(1000)}, now); err == nil {
		t.Error("nodeMemory() of a meminfo without MemFree = nil error, want one")
	}
}
