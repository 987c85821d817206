package kubelet

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// TestGracefulShutdown ends the pods of a node of a real control plane,
// running on a real containerd, as its shutdown does: the pods that are
// not critical first — their preStop hooks run, and one that ignores
// SIGTERM is killed once its share of the grace period is over, not its
// own longer one — then the critical pod, whose preStop hook runs after
// theirs. Each ends Failed, reason Terminated, with the kubelet's message
// and the DisruptionTarget condition.
func TestGracefulShutdown(t *testing.T) {
	e, cfg := newPodEnv(t, "shutdown-1")
	a := startStatic(t, cfg)
	e.testNodeReady(t)
	out := t.TempDir()
	hostPath := corev1.HostPathDirectory
	pod := func(name, ns string, grace int64, env []corev1.EnvVar, priorityClass string) *corev1.Pod {
		return e.createPod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &grace, PriorityClassName: priorityClass,
				Containers: []corev1.Container{{
					Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent, Env: env,
					VolumeMounts: []corev1.VolumeMount{{Name: "out", MountPath: "/out"}},
					Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
						Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "touch", "/out/" + name}},
					}},
				}},
				Volumes: []corev1.Volume{{Name: "out", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: out, Type: &hostPath}}}},
			},
		})
	}
	started := []*corev1.Pod{
		pod("regular", "default", 30, nil, ""),
		// Ignores SIGTERM and would have 60 s: it gets the 3 s that are
		// the regular pods' share.
		pod("stubborn", "default", 60, []corev1.EnvVar{{Name: "IGNORE_TERM", Value: "1"}}, ""),
		pod("critical", "kube-system", 30, nil, "system-node-critical"),
	}
	for _, p := range started {
		waitPod(t, e.c.Client, p.Namespace, p.Name, 60*time.Second, "Running", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning
		})
	}
	if p, err := e.c.Client.CoreV1().Pods("kube-system").Get(context.Background(), "critical", metav1.GetOptions{}); err != nil || !pods.IsCritical(p) {
		t.Fatalf("the critical pod's priority: %v (%v), want critical", p.Spec.Priority, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a.k.Shutdown(ctx, 6*time.Second, 3*time.Second)

	for _, p := range started {
		got := waitPod(t, e.c.Client, p.Namespace, p.Name, 30*time.Second, "Failed", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodFailed
		})
		if got.Status.Reason != "Terminated" || got.Status.Message != "Pod was terminated in response to imminent node shutdown." {
			t.Errorf("%s: reason %q, message %q, want the kubelet's node shutdown", p.Name, got.Status.Reason, got.Status.Message)
		}
		var disruption *corev1.PodCondition
		for i := range got.Status.Conditions {
			if got.Status.Conditions[i].Type == corev1.DisruptionTarget {
				disruption = &got.Status.Conditions[i]
			}
		}
		if disruption == nil || disruption.Status != corev1.ConditionTrue || disruption.Reason != "TerminationByKubelet" {
			t.Errorf("%s: DisruptionTarget condition %+v, want True, TerminationByKubelet", p.Name, disruption)
		}
		for _, cs := range got.Status.ContainerStatuses {
			if cs.State.Terminated == nil {
				t.Errorf("%s: container %s %+v after the shutdown, want terminated", p.Name, cs.Name, cs.State)
			}
		}
	}
	var when [2]time.Time
	for i, name := range []string{"regular", "critical"} {
		st, err := os.Stat(filepath.Join(out, name))
		if err != nil {
			t.Fatalf("preStop hook of %s did not run: %v", name, err)
		}
		when[i] = st.ModTime()
	}
	if when[1].Before(when[0]) {
		t.Errorf("the critical pod's preStop ran at %v, before the regular pod's at %v", when[1], when[0])
	}
	// Nothing starts again.
	time.Sleep(2 * time.Second)
	for _, p := range started {
		got, err := e.c.Client.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cs := range got.Status.ContainerStatuses {
			if cs.State.Running != nil {
				t.Errorf("%s: %s running again after the shutdown", p.Name, cs.Name)
			}
		}
	}
}
