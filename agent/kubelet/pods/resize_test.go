package pods

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestRestartsOnResize(t *testing.T) {
	cpu := func(req, lim string) corev1.ResourceRequirements {
		r := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(req)}}
		if lim != "" {
			r.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(lim)}
		}
		return r
	}
	withMem := func(r corev1.ResourceRequirements, mem string) corev1.ResourceRequirements {
		r = *r.DeepCopy()
		r.Requests[corev1.ResourceMemory] = resource.MustParse(mem)
		return r
	}
	policy := func(cpu, mem corev1.ResourceResizeRestartPolicy) []corev1.ContainerResizePolicy {
		return []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceCPU, RestartPolicy: cpu}, {ResourceName: corev1.ResourceMemory, RestartPolicy: mem}}
	}
	for _, tc := range []struct {
		name       string
		policy     []corev1.ContainerResizePolicy
		have, want corev1.ResourceRequirements
		restarts   bool
	}{
		{"no policy: in place", nil, cpu("100m", ""), cpu("200m", ""), false},
		{"cpu NotRequired: in place", policy(corev1.NotRequired, corev1.RestartContainer), cpu("100m", ""), cpu("200m", ""), false},
		{"cpu RestartContainer, request changed", policy(corev1.RestartContainer, corev1.NotRequired), cpu("100m", ""), cpu("200m", ""), true},
		{"cpu RestartContainer, limit added", policy(corev1.RestartContainer, corev1.NotRequired), cpu("100m", ""), cpu("100m", "1"), true},
		{"cpu RestartContainer, equal quantities spelt apart", policy(corev1.RestartContainer, corev1.NotRequired), cpu("1", ""), cpu("1000m", ""), false},
		{"memory RestartContainer, only cpu changed", policy(corev1.NotRequired, corev1.RestartContainer), withMem(cpu("100m", ""), "1Mi"), withMem(cpu("200m", ""), "1Mi"), false},
		{"memory RestartContainer, memory changed", policy(corev1.NotRequired, corev1.RestartContainer), withMem(cpu("100m", ""), "1Mi"), withMem(cpu("100m", ""), "2Mi"), true},
	} {
		c := &corev1.Container{Name: "c", ResizePolicy: tc.policy}
		if got := restartsOnResize(c, tc.have, tc.want); got != tc.restarts {
			t.Errorf("%s: restartsOnResize = %v, want %v", tc.name, got, tc.restarts)
		}
	}
}

// TestApplied reads the resources a container was created with from its
// annotation, what the worker resized it to once it did, and the spec's
// for a container made before the annotation was recorded.
func TestApplied(t *testing.T) {
	w := &Worker{}
	created := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}}
	spec := &corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("96Mi")}}}
	cs := &criv1.ContainerStatus{Id: "abc", Annotations: containerAnnotations(&corev1.Container{Resources: created})}
	check := func(what string, cs *criv1.ContainerStatus, want corev1.ResourceRequirements) {
		t.Helper()
		got, err := w.applied(spec, cs)
		if err != nil || !got.Limits.Memory().Equal(*want.Limits.Memory()) {
			t.Errorf("%s: applied = %v, %v; want %v", what, got.Limits, err, want.Limits)
		}
	}
	check("as created", cs, created)
	check("made before the annotation", &criv1.ContainerStatus{Id: "old"}, spec.Resources)
	w.resized.Store("abc", resizedTo{uid: "u", r: spec.Resources})
	check("resized", cs, spec.Resources)
	w.forgetResized(&corev1.Pod{})
	check("resized, another pod forgotten", cs, spec.Resources)
	w.forgetResized(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u"}})
	check("resized, its pod forgotten", cs, created)
}
