package kubelet

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestQOS runs a pod of each QoS class on a node of a real control plane
// with a real containerd, and reads back from the host what the kubelet
// gives each: its cgroup, under /kubepods and its class's
// (/kubepods/burstable/pod<UID>…), and its container's oom_score_adj
// (BestEffort 1000, Burstable in between, Guaranteed -997, which this
// host's containerd raises to its own score, 0: root here may not lower a
// score, hence restrict_oom_score_adj in test/runtime; pods' oomScoreAdj
// test has the exact values).
func TestQOS(t *testing.T) {
	e, cfg := newPodEnv(t, "qos-1")
	start(t, cfg)
	e.testNodeReady(t)
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}
	requests := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
	for _, tc := range []struct {
		name      string
		resources corev1.ResourceRequirements
		cgroup    string
		oom       func(int) bool
	}{
		{"besteffort", corev1.ResourceRequirements{}, "/kubepods/besteffort/pod", func(s int) bool { return s == 1000 }},
		{"guaranteed", corev1.ResourceRequirements{Limits: limits}, "/kubepods/pod", func(s int) bool { return s <= 0 }},
		{"burstable", corev1.ResourceRequirements{Requests: requests}, "/kubepods/burstable/pod", func(s int) bool { return s >= 2 && s < 1000 }},
	} {
		grace := int64(1)
		pod := e.createPod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: "default"},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent, Resources: tc.resources,
			}}},
		})
		running := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Running", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning
		})
		pid := e.containerPID(t, running.Status.ContainerStatuses[0].ContainerID)
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
		if err != nil {
			t.Fatal(err)
		}
		var score int
		fmt.Sscan(string(raw), &score)
		if !tc.oom(score) {
			t.Errorf("%s: oom_score_adj %d", tc.name, score)
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		if want := tc.cgroup + string(pod.UID) + "/"; !strings.Contains(string(cg), want) {
			t.Errorf("%s: cgroups %q, want them under %s", tc.name, cg, want)
		}
		e.deletePod(t, pod)
	}
}
