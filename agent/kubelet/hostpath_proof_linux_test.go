package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
)

// TestHostPathAndImageVolumes proves, on a node of a real control plane
// running its pods on a real containerd, hostPath volumes of every type —
// the host's files themselves, read-only where asked, with their mount
// propagation — and the kubelet's FailedMount events for those of the
// wrong type, and image volumes: an image pulled by its policy and mounted
// read-only, whole or a subPath of it.
func TestHostPathAndImageVolumes(t *testing.T) {
	e, cfg := newPodEnv(t, "hostpath-1")
	start(t, cfg)
	e.testNodeReady(t)

	t.Run("every hostPath type, on a file of that type", e.testHostPathTypes)
	t.Run("hostPath of the wrong type: FailedMount, Pending", e.testHostPathWrongTypes)
	t.Run("mountPropagation", e.testMountPropagation)
	t.Run("image volume", e.testImageVolume)
}

// hostFiles are files of each kind in a directory of the host.
type hostFiles struct {
	dir, file, sock, block string
}

func makeHostFiles(t *testing.T) hostFiles {
	t.Helper()
	dir := t.TempDir()
	h := hostFiles{dir: filepath.Join(dir, "dir"), file: filepath.Join(dir, "file"), sock: filepath.Join(dir, "sock"), block: filepath.Join(dir, "block")}
	if err := os.Mkdir(h.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.dir, "kept"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	// loop0's numbers: the container may stat it, not open it.
	if err := unix.Mknod(h.block, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))); err != nil {
		t.Fatal(err)
	}
	return h
}

// hostPathVolume is a hostPath volume of typ at path.
func hostPathVolume(name, path string, typ corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &typ}}}
}

// testHostPathTypes mounts a hostPath of each type on a file of that kind
// (made by the node for the OrCreate ones) in a container, which sees
// them all, writes in the directory, which the host sees, and may not
// write through the read-only mount of it. The host's files stay after
// the pod is deleted.
func (e *podEnv) testHostPathTypes(t *testing.T) {
	h := makeHostFiles(t)
	made := filepath.Join(filepath.Dir(h.dir), "made", "here")
	newFile := filepath.Join(filepath.Dir(h.dir), "new")
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hostpath-types", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "dir", MountPath: "/dir"},
					{Name: "dir", MountPath: "/dir-ro", ReadOnly: true},
					{Name: "plain", MountPath: "/plain"},
					{Name: "file", MountPath: "/file"},
					{Name: "sock", MountPath: "/sock"},
					{Name: "char", MountPath: "/char"},
					{Name: "block", MountPath: "/block"},
					{Name: "made", MountPath: "/made"},
					{Name: "new", MountPath: "/new"},
				},
			}},
			Volumes: []corev1.Volume{
				hostPathVolume("dir", h.dir, corev1.HostPathDirectory),
				hostPathVolume("plain", h.dir, corev1.HostPathUnset),
				hostPathVolume("file", h.file, corev1.HostPathFile),
				hostPathVolume("sock", h.sock, corev1.HostPathSocket),
				hostPathVolume("char", "/dev/null", corev1.HostPathCharDev),
				hostPathVolume("block", h.block, corev1.HostPathBlockDev),
				hostPathVolume("made", made, corev1.HostPathDirectoryOrCreate),
				hostPathVolume("new", newFile, corev1.HostPathFileOrCreate),
			},
		},
	})
	running := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	})
	id := strings.TrimPrefix(running.Status.ContainerStatuses[0].ContainerID, "containerd://")
	for _, p := range []string{"/dir/kept", "/dir-ro/kept", "/plain/kept", "/file", "/sock", "/char", "/block", "/made", "/new"} {
		if out, code := e.exec(t, id, "check", p); code != 0 {
			t.Errorf("in the container, %s: %s (exit %d), want it there", p, out, code)
		}
	}
	if out, code := e.exec(t, id, "touch", "/dir/from-container"); code != 0 {
		t.Errorf("touch /dir/from-container: %s (exit %d)", out, code)
	} else if _, err := os.Stat(filepath.Join(h.dir, "from-container")); err != nil {
		t.Errorf("the container's file on the host: %v", err)
	}
	if out, code := e.exec(t, id, "touch", "/dir-ro/no"); code == 0 || !strings.Contains(out, "read-only file system") {
		t.Errorf("touch /dir-ro/no: %q (exit %d), want refused on a read-only file system", out, code)
	}
	for _, m := range []struct {
		path string
		mode os.FileMode
	}{{made, os.ModeDir | 0o755}, {newFile, 0o644}} {
		if info, err := os.Stat(m.path); err != nil || info.Mode() != m.mode {
			t.Errorf("the node made %s: %v (%v), want mode %v", m.path, info, err, m.mode)
		}
	}

	e.deletePod(t, pod)
	for _, p := range []string{filepath.Join(h.dir, "kept"), filepath.Join(h.dir, "from-container"), h.file, h.sock, h.block, made, newFile} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("after the pod's deletion, %s: %v, want the host's file left", p, err)
		}
	}
}

// testHostPathWrongTypes mounts hostPaths of the wrong type, each a
// FailedMount event about the pod with the kubelet's message, while the
// container waits and the pod stays Pending.
func (e *podEnv) testHostPathWrongTypes(t *testing.T) {
	h := makeHostFiles(t)
	missingParent := filepath.Join(filepath.Dir(h.dir), "none", "file")
	vols := []corev1.Volume{
		hostPathVolume("dir", h.file, corev1.HostPathDirectory),
		hostPathVolume("dir-or-create", h.file, corev1.HostPathDirectoryOrCreate),
		hostPathVolume("file", h.dir, corev1.HostPathFile),
		hostPathVolume("file-or-create", missingParent, corev1.HostPathFileOrCreate),
		hostPathVolume("sock", h.file, corev1.HostPathSocket),
		hostPathVolume("char", h.block, corev1.HostPathCharDev),
		hostPathVolume("block", "/dev/null", corev1.HostPathBlockDev),
	}
	want := map[string]string{
		"dir":            "hostPath type check failed: " + h.file + " is not a directory, it's a File",
		"dir-or-create":  "hostPath type check failed: " + h.file + " is not a directory, it's a File",
		"file":           "hostPath type check failed: " + h.dir + " is not a file, it's a Directory",
		"file-or-create": "open " + missingParent + ": no such file or directory",
		"sock":           "hostPath type check failed: " + h.file + " is not a socket file, it's a File",
		"char":           "hostPath type check failed: " + h.block + " is not a character device, it's a BlockDevice",
		"block":          "hostPath type check failed: /dev/null is not a block device, it's a CharDevice",
	}
	var mounts []corev1.VolumeMount
	for _, v := range vols {
		mounts = append(mounts, corev1.VolumeMount{Name: v.Name, MountPath: "/" + v.Name})
	}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hostpath-wrong", Namespace: "default"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent, VolumeMounts: mounts}},
			Volumes:    vols,
		},
	})
	p := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "waiting for its volumes", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == pods.ErrCreateContainerConfig.Error()
	})
	msg := p.Status.ContainerStatuses[0].State.Waiting.Message
	for name, cause := range want {
		if w := fmt.Sprintf("MountVolume.SetUp failed for volume %q : %s", name, cause); !strings.Contains(msg, w) {
			t.Errorf("waiting message %q, want it to contain %q", msg, w)
		}
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("phase %s, want Pending", p.Status.Phase)
	}
	poll.Until(t, 30*time.Second, "a FailedMount event about the pod for each volume", func() error {
		list, err := e.c.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID), "reason": "FailedMount"}.String(),
		})
		if err != nil {
			return err
		}
		var got []string
		for _, ev := range list.Items {
			if ev.Type == corev1.EventTypeWarning && ev.InvolvedObject.FieldPath == "" {
				got = append(got, ev.Message)
			}
		}
		for name, cause := range want {
			if w := fmt.Sprintf("MountVolume.SetUp failed for volume %q : %s", name, cause); !slices.Contains(got, w) {
				return fmt.Errorf("no %q among %q", w, got)
			}
		}
		return nil
	})
	if _, err := os.Stat(filepath.Dir(missingParent)); !os.IsNotExist(err) {
		t.Errorf("FileOrCreate made the missing parent: %v", err)
	}
	e.deletePod(t, pod)
}

// testMountPropagation mounts one host directory, itself a shared mount
// point, three times: with None, HostToContainer and Bidirectional (the
// container is privileged). A tmpfs mounted on the host under it once the
// container runs is seen through HostToContainer's mount but not None's;
// the runtime was asked for rshared with Bidirectional.
func (e *podEnv) testMountPropagation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shared")
	later := filepath.Join(dir, "later")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("cairn-test", dir, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Unmount(later, unix.MNT_DETACH)
		unix.Unmount(dir, unix.MNT_DETACH)
	})
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(later, 0o755); err != nil {
		t.Fatal(err)
	}
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "propagation", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "shared", MountPath: "/none", MountPropagation: ptr.To(corev1.MountPropagationNone)},
					{Name: "shared", MountPath: "/h2c", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
					{Name: "shared", MountPath: "/bi", MountPropagation: ptr.To(corev1.MountPropagationBidirectional)},
				},
			}},
			Volumes: []corev1.Volume{hostPathVolume("shared", dir, corev1.HostPathDirectory)},
		},
	})
	running := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	})
	id := strings.TrimPrefix(running.Status.ContainerStatuses[0].ContainerID, "containerd://")

	if err := unix.Mount("cairn-test-later", later, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(later, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the host's later mount seen through HostToContainer", func() error {
		if out, code := e.exec(t, id, "check", "/h2c/later/marker"); code != 0 {
			return fmt.Errorf("%s (exit %d)", out, code)
		}
		return nil
	})
	if out, code := e.exec(t, id, "check", "/none/later/marker"); code == 0 {
		t.Errorf("/none/later/marker seen in the container (%s), want the host's later mount not propagated with None", out)
	}
	want := map[string]string{"/none": "rprivate", "/h2c": "rslave", "/bi": "rshared"}
	for dest, opts := range e.specMounts(t, id) {
		if w, ok := want[dest]; ok {
			if !slices.Contains(opts, w) {
				t.Errorf("runtime's mount %s has options %v, want %s", dest, opts, w)
			}
			delete(want, dest)
		}
	}
	if len(want) > 0 {
		t.Errorf("runtime's spec has no mounts %v", want)
	}
	e.deletePod(t, pod)
}

// specMounts are the options of the mounts in the OCI spec the runtime
// made for container id, by destination.
func (e *podEnv) specMounts(t *testing.T, id string) map[string][]string {
	t.Helper()
	st, err := e.rt.RuntimeClient.ContainerStatus(context.Background(), &criv1.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		RuntimeSpec struct {
			Mounts []struct {
				Destination string   `json:"destination"`
				Options     []string `json:"options"`
			} `json:"mounts"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		t.Fatalf("container %s's verbose info: %v", id, err)
	}
	out := map[string][]string{}
	for _, m := range info.RuntimeSpec.Mounts {
		out[m.Destination] = m.Options
	}
	return out
}

// testImageVolume builds an image of data files only, no program, and
// mounts it with pull policy Always in a container, whole and a subPath
// of it: the container sees its files and may not write there; the pull
// is an event about the pod. An image volume whose image is absent, with
// pull policy Never, makes the container wait with the kubelet's reason.
func (e *podEnv) testImageVolume(t *testing.T) {
	img, err := crane.Image(map[string][]byte{
		"kitten/data.json":  []byte(`{"image": "kitten.jpg"}` + "\n"),
		"etc/cairn-release": []byte("cairn test data\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := registry.Push(ctx, e.reg, img, "cairn-test/imagevolume:v1"); err != nil {
		t.Fatal(err)
	}
	ref := e.reg.Addr + "/cairn-test/imagevolume:v1"
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "image-volume", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "data", MountPath: "/volume"},
					{Name: "data", MountPath: "/kitten", SubPath: "kitten"},
				},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: ref, PullPolicy: corev1.PullAlways}}}},
		},
	})
	running := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	})
	id := strings.TrimPrefix(running.Status.ContainerStatuses[0].ContainerID, "containerd://")
	for _, p := range []string{"/volume/kitten/data.json", "/volume/etc/cairn-release", "/kitten/data.json"} {
		if out, code := e.exec(t, id, "check", p); code != 0 {
			t.Errorf("in the container, %s: %s (exit %d), want the image's file", p, out, code)
		}
	}
	if out, code := e.exec(t, id, "check", "/kitten/cairn-release"); code == 0 {
		t.Errorf("/kitten/cairn-release in the container (%s), want only the subPath's files", out)
	}
	if out, code := e.exec(t, id, "touch", "/volume/no"); code == 0 || !strings.Contains(out, "read-only file system") {
		t.Errorf("touch /volume/no: %q (exit %d), want refused on a read-only file system", out, code)
	}
	poll.Until(t, 30*time.Second, "a Pulling event about the pod for the volume's image", func() error {
		list, err := e.c.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID), "reason": "Pulling"}.String(),
		})
		if err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.InvolvedObject.FieldPath == "" && ev.Message == fmt.Sprintf("Pulling image %q", ref) {
				return nil
			}
		}
		return fmt.Errorf("none among %v", messages(list.Items))
	})
	e.deletePod(t, pod)

	absent := e.reg.Addr + "/cairn-test/absent:v1"
	pod = e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "image-volume-never", Namespace: "default"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/volume"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: absent, PullPolicy: corev1.PullNever}}}},
		},
	})
	p := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "waiting for its volume's image", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == pods.ErrImageNeverPull.Error()
	})
	if w, want := p.Status.ContainerStatuses[0].State.Waiting.Message, fmt.Sprintf("Container image %q is not present with pull policy of Never", absent); w != want {
		t.Errorf("waiting message %q, want %q", w, want)
	}
	e.deletePod(t, pod)
}

// exec runs probee with args in the container id and returns its output
// and exit code.
func (e *podEnv) exec(t *testing.T, id string, args ...string) (string, int32) {
	t.Helper()
	resp, err := e.rt.RuntimeClient.ExecSync(context.Background(), &criv1.ExecSyncRequest{
		ContainerId: id, Cmd: append([]string{"/usr/bin/probee"}, args...), Timeout: 10,
	})
	if err != nil {
		t.Fatalf("exec probee %v in %s: %v", args, id, err)
	}
	return strings.TrimSpace(string(resp.Stdout) + string(resp.Stderr)), resp.ExitCode
}
