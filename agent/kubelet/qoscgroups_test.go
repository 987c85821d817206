package kubelet

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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
		if mem != tc.mem || cpu != tc.cpu || cpuWeight(tc.pod) != tc.weight {
			t.Errorf("%s: memory.max %q, cpu.max %q, cpu.weight %q; want %q, %q, %q", tc.name, mem, cpu, cpuWeight(tc.pod), tc.mem, tc.cpu, tc.weight)
		}
	}
}
