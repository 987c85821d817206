package pods

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func TestQOSClassAndOOMScoreAdj(t *testing.T) {
	was := memoryCapacity
	memoryCapacity = func() int64 { return 8 << 30 }
	t.Cleanup(func() { memoryCapacity = was })
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}
	pod := func(r corev1.ResourceRequirements) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: r}}}}
	}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		class corev1.PodQOSClass
		score int64
	}{
		{"nothing", pod(corev1.ResourceRequirements{}), corev1.PodQOSBestEffort, 1000},
		{"limits alone", pod(corev1.ResourceRequirements{Limits: limits}), corev1.PodQOSGuaranteed, -997},
		{"requests equal limits", pod(corev1.ResourceRequirements{Limits: limits, Requests: limits}), corev1.PodQOSGuaranteed, -997},
		{"a quarter of the memory", pod(corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}}), corev1.PodQOSBurstable, 750},
		{"more than the node", pod(corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("16Gi")}}), corev1.PodQOSBurstable, 2},
		{"CPU alone", pod(corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}), corev1.PodQOSBurstable, 999},
	} {
		if got := QOSClass(tc.pod); got != tc.class {
			t.Errorf("%s: QOSClass = %s, want %s", tc.name, got, tc.class)
		}
		if got := oomScoreAdj(tc.pod, &tc.pod.Spec.Containers[0]); got != tc.score {
			t.Errorf("%s: oomScoreAdj = %d, want %d", tc.name, got, tc.score)
		}
	}
	critical := pod(corev1.ResourceRequirements{})
	critical.Spec.Priority = ptr.To[int32](2_000_001_000)
	if got := oomScoreAdj(critical, &critical.Spec.Containers[0]); got != -997 {
		t.Errorf("a critical BestEffort pod: oomScoreAdj = %d, want -997", got)
	}
	declared := pod(corev1.ResourceRequirements{})
	declared.Status.QOSClass = corev1.PodQOSBurstable
	if got := QOSClass(declared); got != corev1.PodQOSBurstable {
		t.Errorf("QOSClass of a pod whose status says Burstable = %s", got)
	}
}
