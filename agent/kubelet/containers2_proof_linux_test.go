package kubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestContainerOutputs runs pods through the API on a real containerd and
// wants what their containers get and leave as the kubelet has it: the
// keys of envFrom's ConfigMaps and Secrets whose names are no shell names
// (data-1) in the environment, and a termination message, written by a
// container that does not run as root, in the Pod's status.
func TestContainerOutputs(t *testing.T) {
	e, cfg := newPodEnv(t, "outputs-1")
	start(t, cfg)

	t.Run("envFrom keys that are no shell names", e.testEnvFromNames)
	t.Run("termination message in the status", func(t *testing.T) { e.testTerminationMessage(t, cfg.Dir) })
}

func (e *podEnv) testEnvFromNames(t *testing.T) {
	data := map[string]string{"data-1": "value-1", "data-2": "value-2"}
	e.createConfigMap(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dashes"}, Data: data})
	e.createSecret(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "dashes"}, Data: map[string][]byte{"data-1": []byte("secret-1")}})
	// echoexit prints the variables named CAIRN_*: the prefixes make
	// the keys so, and keep their dashes.
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "env-from-names", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "echo", Image: e.echo, ImagePullPolicy: corev1.PullIfNotPresent,
				EnvFrom: []corev1.EnvFromSource{
					{Prefix: "CAIRN_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "dashes"}}},
					{Prefix: "CAIRN_p-", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "dashes"}}},
					{Prefix: "CAIRN_s-", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "dashes"}}},
				},
			}},
		},
	})
	done := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Succeeded", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded
	})
	want := []string{"args=", "CAIRN_data-1=value-1", "CAIRN_data-2=value-2", "CAIRN_p-data-1=value-1", "CAIRN_p-data-2=value-2", "CAIRN_s-data-1=secret-1"}
	got := runtime.LogLines(t, e.logPath(t, done.Status.ContainerStatuses[0].ContainerID), len(want))
	if !slices.Equal(got, want) {
		t.Errorf("container output %q, want %q", got, want)
	}
	e.deletePod(t, pod)
}

// testTerminationMessage runs a container as a user that is not root
// that writes its message at a path of its own, and wants the message in
// the Pod's terminated state, and the file on the node, under the
// kubelet's directory dir, gone with the pod.
func (e *podEnv) testTerminationMessage(t *testing.T, dir string) {
	user := int64(1000)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "message", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "echo", Image: e.echo, ImagePullPolicy: corev1.PullIfNotPresent,
				TerminationMessagePath: "/dev/termination-custom-log",
				Env:                    []corev1.EnvVar{{Name: "WRITE", Value: "/dev/termination-custom-log"}, {Name: "TEXT", Value: "DONE"}},
				SecurityContext:        &corev1.SecurityContext{RunAsUser: &user},
			}},
		},
	})
	done := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Succeeded", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	cs := done.Status.ContainerStatuses
	if done.Status.Phase != corev1.PodSucceeded || len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.Message != "DONE" {
		t.Errorf("pod %s with containers %+v, want Succeeded with the message DONE", done.Status.Phase, cs)
	}
	podDir := filepath.Join(dir, "pods", string(pod.UID))
	if _, err := os.Stat(filepath.Join(podDir, "containers", "echo", "0")); err != nil {
		t.Errorf("the termination message file: %v", err)
	}
	e.deletePod(t, pod)
	poll.Until(t, 30*time.Second, "the pod's directory removed", func() error {
		if _, err := os.Stat(podDir); !os.IsNotExist(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}
