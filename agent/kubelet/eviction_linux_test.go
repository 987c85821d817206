package kubelet

import (
	"context"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEmptyDirSizeLimit runs, on a node of a real control plane with a
// real containerd, a pod that writes 2 MiB in an emptyDir limited to
// 1 MiB, which the node evicts as the kubelet does (Failed, Evicted, its
// message and the DisruptionTarget condition), beside one that stays
// within its limit and runs on.
func TestEmptyDirSizeLimit(t *testing.T) {
	e, cfg := newPodEnv(t, "evict-1")
	start(t, cfg)
	e.testNodeReady(t)
	pod := func(name, limit string, size int) *corev1.Pod {
		grace := int64(30)
		q := resource.MustParse(limit)
		return e.createPod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{
					Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
					Env:          []corev1.EnvVar{{Name: "TOUCH_FILE", Value: "/scratch/data"}, {Name: "TOUCH_SIZE", Value: strconv.Itoa(size)}, {Name: "TOUCH_AFTER", Value: "1"}},
					VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
				}},
				Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &q}}}},
			},
		})
	}
	within := pod("within", "4Mi", 1<<20)
	filler := pod("filler", "1Mi", 2<<20)
	got := waitPod(t, e.c.Client, "default", filler.Name, 90*time.Second, "evicted", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed
	})
	const msg = `Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". `
	if got.Status.Reason != "Evicted" || got.Status.Message != msg {
		t.Errorf("filler: reason %q, message %q; want Evicted, %q", got.Status.Reason, got.Status.Message, msg)
	}
	var disruption *corev1.PodCondition
	for i := range got.Status.Conditions {
		if got.Status.Conditions[i].Type == corev1.DisruptionTarget {
			disruption = &got.Status.Conditions[i]
		}
	}
	if disruption == nil || disruption.Status != corev1.ConditionTrue || disruption.Reason != "TerminationByKubelet" {
		t.Errorf("filler: DisruptionTarget %+v, want True, TerminationByKubelet", disruption)
	}
	// The pod within its limit wrote its file long ago and was synced
	// since (each pod resyncs every 10 s): it runs on.
	e.waitWakeups(t, wakeResync, 2)
	w, err := e.c.Client.CoreV1().Pods("default").Get(context.Background(), within.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Status.Phase != corev1.PodRunning {
		t.Errorf("within: phase %s (%s %s), want Running", w.Status.Phase, w.Status.Reason, w.Status.Message)
	}
}
