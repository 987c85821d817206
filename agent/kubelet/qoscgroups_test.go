package kubelet

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestPodCgroupSettings(t *testing.T) {
	pod := func(cs ...corev1.ResourceRequirements) *corev1.Pod {
		p := &corev1.Pod{}
		for _, r := range cs {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Resources: r})
		}
		return p
	}
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	limited := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: q("500m"), corev1.ResourceMemory: q("64Mi")}}
	requested := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("1"), corev1.ResourceMemory: q("1Gi")}}
	for _, tc := range []struct {
		name             string
		pod              *corev1.Pod
		mem, cpu, weight string
	}{
		{"besteffort", pod(corev1.ResourceRequirements{}), "", "", "1"},
		{"two limited containers", pod(limited, limited), "134217728", "100000 100000", "39"},
		{"one limited, one not", pod(limited, requested), "", "", "59"},
		{"a CPU request", pod(requested), "", "", "39"},
	} {
		mem, cpu := podLimits(tc.pod)
		if w := weight(cpuRequest(tc.pod)); mem != tc.mem || cpu != tc.cpu || w != tc.weight {
			t.Errorf("%s: memory.max %q, cpu.max %q, cpu.weight %q; want %q, %q, %q", tc.name, mem, cpu, w, tc.mem, tc.cpu, tc.weight)
		}
	}
}

// TestBurstableClassWeight checks the Burstable class's CPU weight as
// its pods come and go, on a directory standing for the cgroup v2 mount
// (this host's cgroups are v1; e2e TestBoot reads the node's).
func TestBurstableClassWeight(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "kubepods/burstable"), 0o755); err != nil {
		t.Fatal(err)
	}
	q := &qosCgroups{root: root, log: slog.New(slog.DiscardHandler)}
	burstable := func(uid, cpu string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}},
		}}}}
	}
	a, b := burstable("a", "1"), burstable("b", "500m")
	besteffort := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "c"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{}}}}
	for _, tc := range []struct {
		name   string
		active []*corev1.Pod
		want   string
	}{
		{"no pods", nil, weight(0)},
		{"one of 1 CPU", []*corev1.Pod{a, besteffort}, weight(1000)},
		{"1.5 CPU", []*corev1.Pod{a, b, besteffort}, weight(1500)},
		{"a pod counted once", []*corev1.Pod{a, b, a}, weight(1500)},
		{"one gone", []*corev1.Pod{b}, weight(500)},
	} {
		q.weighBurstable(tc.active)
		got, err := os.ReadFile(filepath.Join(root, "kubepods/burstable/cpu.weight"))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want {
			t.Errorf("%s: cpu.weight %s, want %s", tc.name, got, tc.want)
		}
	}
	if weight(1500) != "59" {
		t.Errorf("weight of 1.5 CPU = %s, want 59 (1536 shares)", weight(1500))
	}
}
