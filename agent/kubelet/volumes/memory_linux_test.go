package volumes

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/test/need"
)

// TestMemoryVolumes sets up, with Tmpfs, a secret volume and an emptyDir
// of medium Memory, each on a tmpfs of its own (the emptyDir's of its
// sizeLimit, past which a write fails), beside an emptyDir on disk, and
// tears them down: unmounted, then removed.
func TestMemoryVolumes(t *testing.T) {
	need.Root(t, "mounts tmpfs")
	e := newNodeEnv(t)
	e.m.Tmpfs = true
	ctx := context.Background()
	if _, err := e.c.Client.CoreV1().Secrets(e.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "memory"}, Data: map[string][]byte{"password": []byte("s3cret")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	limit := resource.MustParse("1Mi")
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "memory"},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "memory"}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &limit}}},
			{Name: "disk", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		}},
	})
	paths, err := e.setup(pod)
	if err != nil {
		t.Fatal(err)
	}
	tmpfs := func(path string) *mountinfo.Info {
		ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 0 {
			return nil
		}
		return ms[0]
	}
	for _, name := range []string{"secret", "scratch"} {
		if m := tmpfs(paths[name]); m == nil || m.FSType != "tmpfs" {
			t.Errorf("volume %s at %s: mount %+v, want a tmpfs", name, paths[name], m)
		}
	}
	if m := tmpfs(paths["disk"]); m != nil {
		t.Errorf("emptyDir on disk is a mount %+v, want a directory", m)
	}
	if got := read(t, filepath.Join(paths["secret"], "password")); got != "s3cret" {
		t.Errorf("secret file = %q, want s3cret", got)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(paths["scratch"], &st); err != nil {
		t.Fatal(err)
	}
	if size := int64(st.Blocks) * st.Bsize; size != limit.Value() {
		t.Errorf("memory emptyDir's tmpfs holds %d bytes, want its sizeLimit %d", size, limit.Value())
	}
	if mode(t, paths["scratch"]) != 0o777 {
		t.Errorf("memory emptyDir mode %v, want 0777", mode(t, paths["scratch"]))
	}
	err = os.WriteFile(filepath.Join(paths["scratch"], "big"), make([]byte, 2<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("writing 2 MiB in a 1 MiB memory emptyDir: %v, want ENOSPC", err)
	}

	if err := e.m.TearDown(pod.UID); err != nil {
		t.Fatal(err)
	}
	for name, p := range paths {
		if m := tmpfs(p); m != nil {
			t.Errorf("volume %s still mounted after TearDown: %+v", name, m)
		}
	}
	if _, err := os.Stat(filepath.Join(e.m.Root, string(pod.UID))); !os.IsNotExist(err) {
		t.Errorf("pod directory after TearDown: %v, want it gone", err)
	}
}

// TestTearDownKeepsWhatIsMounted tears down a pod under whose directory
// something not of its own volumes is still mounted (a CSI volume its
// driver did not unmount): the directory stays, and the error says what.
func TestTearDownKeepsWhatIsMounted(t *testing.T) {
	need.Root(t, "mounts")
	m := &Manager{Root: t.TempDir(), Tmpfs: true}
	dir := filepath.Join(m.Root, "uid-1", "volumes", "kubernetes.io~csi", "pv-1", "mount")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("other", dir, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(dir, "data"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := m.TearDown("uid-1")
	if err == nil || !strings.Contains(err.Error(), dir+" is still mounted") {
		t.Errorf("TearDown() = %v, want it to say %s is still mounted", err, dir)
	}
	if got := read(t, filepath.Join(dir, "data")); got != "keep" {
		t.Errorf("the mounted volume's file = %q after TearDown, want it kept", got)
	}
}
