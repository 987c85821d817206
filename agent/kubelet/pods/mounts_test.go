package pods

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestContainerMounts(t *testing.T) {
	dir := t.TempDir()
	pod := &corev1.Pod{Spec: corev1.PodSpec{Volumes: []corev1.Volume{
		{Name: "kube-api-access-x", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}},
		{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}}}
	paths := map[string]string{"kube-api-access-x": dir + "/api", "cm": dir + "/cm", "scratch": dir + "/scratch"}
	if err := os.MkdirAll(paths["scratch"], 0o755); err != nil {
		t.Fatal(err)
	}
	c := &corev1.Container{VolumeMounts: []corev1.VolumeMount{
		{Name: "kube-api-access-x", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
		{Name: "cm", MountPath: "/etc/cm"}, // read-only though not asked
		{Name: "scratch", MountPath: "/scratch"},
		{Name: "scratch", MountPath: "/ro", ReadOnly: true},
		{Name: "scratch", MountPath: "/sub", SubPath: "a/b"},
		{Name: "scratch", MountPath: "/expr", SubPathExpr: "$(ANNOTATION)/$(POD_NAME)-$$(POD_NAME)"},
	}}
	env := []*criv1.KeyValue{{Key: "POD_NAME", Value: []byte("web-1")}, {Key: "ANNOTATION", Value: []byte("mypath")},
		{Key: "EMPTY"}, {Key: "UP", Value: []byte("..")}, {Key: "ABS", Value: []byte("/tmp")}}
	got, err := containerMounts(pod, c, paths, env)
	if err != nil {
		t.Fatalf("containerMounts = %v", err)
	}
	want := []*criv1.Mount{
		{ContainerPath: "/var/run/secrets/kubernetes.io/serviceaccount", HostPath: dir + "/api", Readonly: true},
		{ContainerPath: "/etc/cm", HostPath: dir + "/cm", Readonly: true},
		{ContainerPath: "/scratch", HostPath: dir + "/scratch"},
		{ContainerPath: "/ro", HostPath: dir + "/scratch", Readonly: true},
		{ContainerPath: "/sub", HostPath: dir + "/scratch/a/b"},
		{ContainerPath: "/expr", HostPath: dir + "/scratch/mypath/web-1-$(POD_NAME)"},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("containerMounts (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name string
		vm   corev1.VolumeMount
		want string
	}{
		{"no such volume", corev1.VolumeMount{Name: "nope", MountPath: "/x"}, `volume "nope" mounted at /x: the pod has no such volume`},
		{"subPathExpr of an undefined variable", corev1.VolumeMount{Name: "scratch", MountPath: "/x", SubPathExpr: "a/$(POD)"}, `subPathExpr "a/$(POD)": no value for POD`},
		{"subPathExpr of an empty variable", corev1.VolumeMount{Name: "scratch", MountPath: "/x", SubPathExpr: "$(EMPTY)"}, "no value for EMPTY"},
		{"subPathExpr to ..", corev1.VolumeMount{Name: "scratch", MountPath: "/x", SubPathExpr: "$(UP)"}, "not a relative path inside the volume"},
		{"subPathExpr with .. inside", corev1.VolumeMount{Name: "scratch", MountPath: "/x", SubPathExpr: "a/$(UP)/b"}, "not a relative path inside the volume"},
		{"subPathExpr to an absolute path", corev1.VolumeMount{Name: "scratch", MountPath: "/x", SubPathExpr: "$(ABS)"}, "not a relative path inside the volume"},
		{"subPath leaving the volume", corev1.VolumeMount{Name: "scratch", MountPath: "/x", SubPath: "../api"}, "not a relative path inside the volume"},
	} {
		_, err := containerMounts(pod, &corev1.Container{VolumeMounts: []corev1.VolumeMount{tc.vm}}, paths, env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: containerMounts = %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

func TestSubPath(t *testing.T) {
	vol := filepath.Join(t.TempDir(), "vol")
	outside := t.TempDir()
	// The layout of a volume the node writes: token -> ..data/token.
	if err := os.MkdirAll(filepath.Join(vol, "..ts"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { return os.WriteFile(filepath.Join(vol, "..ts", "token"), []byte("t"), 0o644) },
		func() error { return os.Symlink("..ts", filepath.Join(vol, "..data")) },
		func() error { return os.Symlink("..data/token", filepath.Join(vol, "token")) },
		func() error { return os.Symlink(outside, filepath.Join(vol, "escape")) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}

	if got, err := subPath(vol, "token"); err != nil || got != filepath.Join(vol, "..ts", "token") {
		t.Errorf("subPath(token) = %q, %v; want the file in the timestamped directory", got, err)
	}
	if got, err := subPath(vol, "new/dir"); err != nil || got != filepath.Join(vol, "new", "dir") {
		t.Errorf("subPath(new/dir) = %q, %v; want it made", got, err)
	} else if info, err := os.Stat(got); err != nil || !info.IsDir() {
		t.Errorf("subPath(new/dir) made %v (%v), want a directory", info, err)
	}
	for _, sub := range []string{"escape", "escape/made"} {
		if got, err := subPath(vol, sub); err == nil || !strings.Contains(err.Error(), "leads outside the volume") {
			t.Errorf("subPath(%s) = %q, %v; want it refused", sub, got, err)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "made")); !os.IsNotExist(err) {
		t.Errorf("a refused subPath made a directory outside the volume: %v", err)
	}
}
