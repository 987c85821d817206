package volumes

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cairn-os/cairn/test/need"
)

// TestFSGroup sets up the volumes of a pod with an fsGroup: the files of
// its secret volume and its emptyDir belong to the group, readable (and,
// for the emptyDir, writable) by it, directories setgid so that what the
// pod writes belongs to the group too. With OnRootMismatch, a volume whose
// top directory is the group's already is left as it is.
func TestFSGroup(t *testing.T) {
	need.Root(t, "changes files' owners")
	e := newNodeEnv(t)
	ctx := context.Background()
	if _, err := e.c.Client.CoreV1().Secrets(e.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "fsgroup"}, Data: map[string][]byte{"key": []byte("v")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const gid = 2345
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fsgroup"},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{FSGroup: ptr.To[int64](gid)},
			Volumes: []corev1.Volume{
				{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "fsgroup", DefaultMode: ptr.To[int32](0o400)}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
	})
	paths, err := e.setup(pod)
	if err != nil {
		t.Fatal(err)
	}
	owner := func(path string) (int, fs.FileMode) {
		t.Helper()
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return int(info.Sys().(*syscall.Stat_t).Gid), info.Mode()
	}
	if g, m := owner(filepath.Join(paths["secret"], "key")); g != gid || m.Perm() != 0o440 {
		t.Errorf("secret file: group %d, mode %v; want %d, 0440 (its 0400 and the group's read)", g, m, gid)
	}
	if g, m := owner(paths["scratch"]); g != gid || m&fs.ModeSetgid == 0 || m.Perm() != 0o777 {
		t.Errorf("emptyDir: group %d, mode %v; want %d, setgid, 0777", g, m, gid)
	}
	written := filepath.Join(paths["scratch"], "by-the-pod")
	if err := os.WriteFile(written, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if g, _ := owner(written); g != gid {
		t.Errorf("a file the pod writes in the emptyDir: group %d, want %d (setgid directory)", g, gid)
	}

	// OnRootMismatch: the top directory matches, so a file of another
	// group inside stays so.
	if err := e.m.TearDown(pod.UID); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inner := filepath.Join(dir, "inner")
	if err := os.WriteFile(inner, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, -1, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o770|fs.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	pod.Spec.SecurityContext.FSGroupChangePolicy = ptr.To(corev1.FSGroupChangeOnRootMismatch)
	if err := setOwnership(dir, pod, false); err != nil {
		t.Fatal(err)
	}
	if g, _ := owner(inner); g == gid {
		t.Errorf("OnRootMismatch with a matching top directory changed a file inside")
	}
	pod.Spec.SecurityContext.FSGroupChangePolicy = ptr.To(corev1.FSGroupChangeAlways)
	if err := setOwnership(dir, pod, false); err != nil {
		t.Fatal(err)
	}
	if g, m := owner(inner); g != gid || m.Perm() != 0o660 {
		t.Errorf("Always: file group %d, mode %v; want %d, 0660", g, m, gid)
	}
}
