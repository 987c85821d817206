package pods

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"
)

// TestImageAndPropagationMounts: image volumes are the runtime's
// read-only mounts of their image, by the name the runtime pulled it as;
// a hostPath is mounted where it is, read-only if asked, with the mount
// propagation asked, Bidirectional only for a privileged container.
func TestImageAndPropagationMounts(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Volumes: []corev1.Volume{
		{Name: "img", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "busybox"}}},
		{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv"}}},
	}}}
	paths := map[string]string{"host": "/srv"}
	c := &corev1.Container{
		SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "img", MountPath: "/img"},
			{Name: "img", MountPath: "/etc-of-img", SubPath: "etc"},
			{Name: "img", MountPath: "/dir-of-img", SubPathExpr: "$(DIR)"},
			{Name: "host", MountPath: "/srv", ReadOnly: true},
			{Name: "host", MountPath: "/none", MountPropagation: ptr.To(corev1.MountPropagationNone)},
			{Name: "host", MountPath: "/h2c", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
			{Name: "host", MountPath: "/bi", MountPropagation: ptr.To(corev1.MountPropagationBidirectional)},
		},
	}
	got, err := containerMounts(pod, c, paths, []*criv1.KeyValue{{Key: "DIR", Value: []byte("usr")}})
	if err != nil {
		t.Fatalf("containerMounts = %v", err)
	}
	img := &criv1.ImageSpec{Image: "docker.io/library/busybox:latest"}
	want := []*criv1.Mount{
		{ContainerPath: "/img", Image: img, Readonly: true},
		{ContainerPath: "/etc-of-img", Image: img, ImageSubPath: "etc", Readonly: true},
		{ContainerPath: "/dir-of-img", Image: img, ImageSubPath: "usr", Readonly: true},
		{ContainerPath: "/srv", HostPath: "/srv", Readonly: true},
		{ContainerPath: "/none", HostPath: "/srv"},
		{ContainerPath: "/h2c", HostPath: "/srv", Propagation: criv1.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
		{ContainerPath: "/bi", HostPath: "/srv", Propagation: criv1.MountPropagation_PROPAGATION_BIDIRECTIONAL},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("containerMounts (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name string
		c    *corev1.Container
		want string
	}{
		{"Bidirectional unprivileged", &corev1.Container{VolumeMounts: []corev1.VolumeMount{
			{Name: "host", MountPath: "/bi", MountPropagation: ptr.To(corev1.MountPropagationBidirectional)}}},
			`volume "host" mounted at /bi: Bidirectional mount propagation is available only to privileged containers`},
		{"unknown propagation", &corev1.Container{VolumeMounts: []corev1.VolumeMount{
			{Name: "host", MountPath: "/x", MountPropagation: ptr.To(corev1.MountPropagationMode("Sideways"))}}},
			`invalid MountPropagation mode: "Sideways"`},
		{"image subPath leaving the image", &corev1.Container{VolumeMounts: []corev1.VolumeMount{
			{Name: "img", MountPath: "/x", SubPath: "../etc"}}},
			`volume "img" mounted at /x: subPath "../etc": not a relative path inside the volume`},
	} {
		if _, err := containerMounts(pod, tc.c, paths, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: containerMounts = %v, want an error with %q", tc.name, err, tc.want)
		}
	}

	if got := volumeImages(pod, &corev1.Container{VolumeMounts: []corev1.VolumeMount{{Name: "host"}}}); len(got) != 0 {
		t.Errorf("volumeImages of a container that mounts no image = %v, want none", got)
	}
	got2 := volumeImages(pod, c)
	if len(got2) != 1 || got2[0].Image != "busybox" || got2[0].Name != "" {
		t.Errorf("volumeImages = %+v, want busybox's, unnamed", got2)
	}
}
