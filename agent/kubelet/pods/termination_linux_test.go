package pods_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/agent/kubelet/volumes"
)

// TestTerminationMessages runs containers that leave a message in their
// termination message file, or print one and fail, on a real containerd,
// and wants each message in their terminated status: one written by a
// container that does not run as root at a path of its own, the end of the
// log of a container that failed with the policy FallbackToLogsOnError,
// none from the log of one that succeeded, and the file before the log.
// The files go with the pod.
func TestTerminationMessages(t *testing.T) {
	e := setup(t)
	e.cfg.PodsDir = filepath.Join(t.TempDir(), "pods")
	e.newWorker(t)
	user := int64(1000)
	fromLogs := corev1.TerminationMessageFallbackToLogsOnError
	ctr := func(name, path string, policy corev1.TerminationMessagePolicy, env ...string) corev1.Container {
		c := corev1.Container{Name: name, Image: e.echo, TerminationMessagePath: path, TerminationMessagePolicy: policy}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: v})
		}
		return c
	}
	nonRoot := ctr("non-root", "/dev/termination-custom-log", corev1.TerminationMessageReadFile,
		"WRITE=/dev/termination-custom-log", "TEXT=DONE")
	nonRoot.SecurityContext = &corev1.SecurityContext{RunAsUser: &user}
	pod := newPod("messages", corev1.RestartPolicyNever,
		nonRoot,
		ctr("from-logs", "/dev/termination-log", fromLogs, "EXIT_CODE=1", "LAST=DONE"),
		ctr("succeeded", "/dev/termination-log", fromLogs, "LAST=DONE"),
		ctr("file-first", "/dev/termination-log", fromLogs, "WRITE=/dev/termination-log", "TEXT=OK", "EXIT_CODE=1", "LAST=DONE"),
	)
	st := e.syncUntil(t, pod, "Failed", phaseIs(corev1.PodFailed))
	want := map[string]string{"non-root": "DONE", "from-logs": "args=\nDONE", "succeeded": "", "file-first": "OK"}
	for _, c := range st.Containers {
		if c.State != pods.Terminated || c.Message != want[c.Name] {
			t.Errorf("container %s: %s with message %q, want Terminated with %q", c.Name, c.State, c.Message, want[c.Name])
		}
	}
	podDir := filepath.Join(e.cfg.PodsDir, string(pod.UID))
	if data, err := os.ReadFile(filepath.Join(podDir, "containers", "non-root", "0")); err != nil || string(data) != "DONE" {
		t.Errorf("non-root's termination message file holds %q (%v), want DONE", data, err)
	}
	if err := e.w.Terminate(e.ctx, pod, 0); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if _, err := os.Stat(podDir); !os.IsNotExist(err) {
		t.Errorf("the pod's directory after Terminate: %v, want it gone", err)
	}

	// Those of a pod deleted while the agent was away go with Cleanup.
	orphan := newPod("orphan", corev1.RestartPolicyNever, ctr("c", "/dev/termination-log", corev1.TerminationMessageReadFile))
	e.syncUntil(t, orphan, "Succeeded", phaseIs(corev1.PodSucceeded))
	orphanDir := filepath.Join(e.cfg.PodsDir, string(orphan.UID))
	if _, err := os.Stat(orphanDir); err != nil {
		t.Fatalf("the orphan's directory: %v", err)
	}
	e.w.Cleanup(e.ctx, func(types.UID) bool { return false })
	if _, err := os.Stat(orphanDir); !os.IsNotExist(err) {
		t.Errorf("the orphan's directory after Cleanup: %v, want it gone", err)
	}
}

// TestSubPathExpr mounts the subPath of an emptyDir that a subPathExpr
// names through the downward API, from the pod's name and annotation, on
// a real containerd: what the container writes there lands in that
// directory of the volume. A subPathExpr that comes to .. keeps its
// container from being made.
func TestSubPathExpr(t *testing.T) {
	e := setup(t)
	e.cfg.Volumes = &volumes.Manager{Root: filepath.Join(t.TempDir(), "pods")}
	e.newWorker(t)
	field := func(p string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: p}}
	}
	writer := corev1.Container{
		Name: "writer", Image: e.echo,
		Env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: field("metadata.name")},
			{Name: "ANNOTATION", ValueFrom: field("metadata.annotations['mysubpath']")},
			{Name: "WRITE", Value: "/sub/test.log"}, {Name: "TEXT", Value: "hello"},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "work", MountPath: "/sub", SubPathExpr: "$(ANNOTATION)/$(POD_NAME)"},
			{Name: "work", MountPath: "/volume"},
		},
	}
	pod := newPod("subpath", corev1.RestartPolicyNever, writer)
	pod.Annotations = map[string]string{"mysubpath": "mypath"}
	pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	t.Cleanup(func() { e.w.Terminate(e.ctx, pod, 0) })
	e.syncUntil(t, pod, "Succeeded", phaseIs(corev1.PodSucceeded))
	paths, err := e.cfg.Volumes.Setup(e.ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(paths["work"], "mypath", "subpath", "test.log")); err != nil || string(data) != "hello" {
		t.Errorf("mypath/subpath/test.log in the volume holds %q (%v), want what the container wrote", data, err)
	}

	up := writer
	up.Env = []corev1.EnvVar{{Name: "UP", Value: ".."}}
	up.VolumeMounts = []corev1.VolumeMount{{Name: "work", MountPath: "/sub", SubPathExpr: "$(UP)"}}
	bad := newPod("subpath-up", corev1.RestartPolicyNever, up)
	bad.Spec.Volumes = pod.Spec.Volumes
	t.Cleanup(func() { e.w.Terminate(e.ctx, bad, 0) })
	st, err := e.w.Sync(e.ctx, bad)
	if c := st.Containers[0]; err == nil || c.State != pods.Waiting || c.Reason != pods.ErrCreateContainerConfig.Error() ||
		!strings.Contains(c.Message, "not a relative path inside the volume") {
		t.Errorf("Sync(subPathExpr $(UP) with UP=..) = %+v, %v; want it waiting with CreateContainerConfigError", c, err)
	}
}
