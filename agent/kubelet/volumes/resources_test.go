package volumes

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestResourceFieldRef writes downwardAPI and projected volume items
// with resourceFieldRef, for a Pod of the real API server: limits and
// requests of cpu, memory and ephemeral-storage of the container each
// names, in units of the divisor rounded up, and the node's allocatable
// for a limit the container does not set.
func TestResourceFieldRef(t *testing.T) {
	e := newNodeEnv(t)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.node}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("3"), corev1.ResourceMemory: resource.MustParse("5Gi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("20Gi"),
	}}}
	m := &Manager{Root: t.TempDir(), Client: e.m.Client, Node: func(context.Context) (*corev1.Node, error) { return node, nil }}
	e.m = m
	ref := func(path, container, res, divisor string) corev1.DownwardAPIVolumeFile {
		f := corev1.DownwardAPIVolumeFile{Path: path, ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: container, Resource: res}}
		if divisor != "" {
			f.ResourceFieldRef.Divisor = resource.MustParse(divisor)
		}
		return f
	}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "resources"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "sized", Image: "example.invalid/never-run", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("32Mi"),
					corev1.ResourceEphemeralStorage: resource.MustParse("1Gi")},
				Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1250m"), corev1.ResourceMemory: resource.MustParse("64Mi"),
					corev1.ResourceEphemeralStorage: resource.MustParse("2Gi")},
			}}, {Name: "unsized", Image: "example.invalid/never-run"}},
			Volumes: []corev1.Volume{
				{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
					ref("cpu_limit", "sized", "limits.cpu", ""),
					ref("cpu_limit_m", "sized", "limits.cpu", "1m"),
					ref("cpu_request_m", "sized", "requests.cpu", "1m"),
					ref("memory_limit", "sized", "limits.memory", ""),
					ref("memory_request_mi", "sized", "requests.memory", "1Mi"),
					ref("storage_limit_gi", "sized", "limits.ephemeral-storage", "1Gi"),
					ref("storage_request", "sized", "requests.ephemeral-storage", ""),
					ref("unsized_cpu_limit", "unsized", "limits.cpu", ""),
					ref("unsized_memory_limit_mi", "unsized", "limits.memory", "1Mi"),
					ref("unsized_storage_limit_gi", "unsized", "limits.ephemeral-storage", "1Gi"),
					ref("unsized_cpu_request_m", "unsized", "requests.cpu", "1m"),
				}}}},
				{Name: "mixed", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
						{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
						ref("memory_limit_ki", "sized", "limits.memory", "1Ki"),
					}}},
				}}}},
			},
		},
	})
	t.Cleanup(func() { m.TearDown(pod.UID) })
	paths, err := e.setup(pod)
	if err != nil {
		t.Fatalf("Setup = %v", err)
	}
	for file, want := range map[string]string{
		"cpu_limit":                "2", // 1.25 CPU, rounded up
		"cpu_limit_m":              "1250",
		"cpu_request_m":            "250",
		"memory_limit":             "67108864",
		"memory_request_mi":        "32",
		"storage_limit_gi":         "2",
		"storage_request":          "1073741824",
		"unsized_cpu_limit":        "3", // the node's allocatable
		"unsized_memory_limit_mi":  "5120",
		"unsized_storage_limit_gi": "20",
		"unsized_cpu_request_m":    "0",
	} {
		if got := read(t, filepath.Join(paths["podinfo"], file)); got != want {
			t.Errorf("podinfo/%s = %q, want %q", file, got, want)
		}
	}
	if got := read(t, filepath.Join(paths["mixed"], "memory_limit_ki")); got != "65536" {
		t.Errorf("mixed/memory_limit_ki = %q, want 65536", got)
	}
	if got := read(t, filepath.Join(paths["mixed"], "name")); got != "resources" {
		t.Errorf("mixed/name = %q, want resources", got)
	}
}

// TestResourceFieldRefErrors: a resourceFieldRef that names no container
// of the pod, or whose limit is the node's when the manager cannot read
// the Node, fails the volume with a message that says so.
func TestResourceFieldRefErrors(t *testing.T) {
	e := newNodeEnv(t)
	for _, tc := range []struct {
		name string
		ref  corev1.ResourceFieldSelector
		want string
	}{
		{"no such container", corev1.ResourceFieldSelector{ContainerName: "absent", Resource: "limits.cpu"},
			`MountVolume.SetUp failed for volume "podinfo" : downwardAPI path "x": resourceFieldRef: no container "absent" in the pod`},
		{"no node", corev1.ResourceFieldSelector{ContainerName: "c", Resource: "limits.memory"},
			`MountVolume.SetUp failed for volume "podinfo" : downwardAPI path "x": the node cannot read its Node`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := e.createPod(t, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll(tc.name, " ", "-")},
				Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
					Items: []corev1.DownwardAPIVolumeFile{{Path: "x", ResourceFieldRef: &tc.ref}}}}}}},
			})
			t.Cleanup(func() { e.m.TearDown(pod.UID) })
			if _, err := e.setup(pod); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Setup = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
